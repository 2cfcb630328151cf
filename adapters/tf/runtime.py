"""The process-wide engine fast_tf uses unless a Callback or shard is given one."""

from __future__ import annotations

import fast_core
from fast_core import Engine

_engine: Engine | None = None


def init(timeout: float | None = None) -> Engine:
    """Start FAST for this process: MPI under an MPI launcher, else one local worker (with a notice). Idempotent."""
    global _engine
    if _engine is None:
        _engine = fast_core.init(timeout=timeout)
    return _engine


def rank() -> int:
    """This process's rank (0 without a launcher)."""
    return init().rank


def size() -> int:
    """The number of workers in the job (1 without a launcher)."""
    return init().size
