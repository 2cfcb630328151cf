"""The engine fast_jax uses when none is passed: one per process, made on first use."""

from __future__ import annotations

import threading

import fast_core
from fast_core import Engine

_lock = threading.Lock()
_state: dict[str, Engine] = {}


def init(timeout: float | None = None) -> Engine:
    """Start FAST for this process (MPI under an MPI launcher, else one local worker) and return its engine.

    Later calls return the same engine; ``timeout`` (seconds any wait may last) only counts on the first call.
    """
    with _lock:
        if "engine" not in _state:
            _state["engine"] = fast_core.init(timeout=timeout)
        return _state["engine"]


def rank() -> int:
    """This process's rank (0 .. size - 1)."""
    return init().rank


def size() -> int:
    """The number of ranks training together."""
    return init().size
