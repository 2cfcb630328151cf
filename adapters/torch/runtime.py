"""The process-wide engine fast_torch uses unless told otherwise."""

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


def default_engine() -> Engine:
    return init()


def rank() -> int:
    return init().rank


def size() -> int:
    return init().size
