"""This process's engine, made once and shared by every caller: ``fast_core.init()``, ``fast_torch.init()``,
``fast_tf.init()`` and ``fast_jax.init()`` all return it (MPI under an MPI launcher, else one local worker)."""

from __future__ import annotations

import threading

from .engine import Engine, default_engine

_lock = threading.Lock()
_engine: Engine | None = None


def init(timeout: float | None = None) -> Engine:
    """Start FAST for this process and return its engine; later calls return the same one (``timeout``, the
    seconds any wait on a peer may last, counts only on the first call). A new engine on each call is
    ``fast_core.engine.default_engine``."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = default_engine(timeout=timeout)
        return _engine


def rank() -> int:
    """This process's rank (0 .. size - 1; 0 without a launcher)."""
    return init().rank


def size() -> int:
    """The number of workers training together (1 without a launcher)."""
    return init().size
