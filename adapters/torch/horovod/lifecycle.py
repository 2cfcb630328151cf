"""Horovod's shutdown, also at exit as Horovod does it: the FAST workers of this process are closed (collective),
so an asynchronous strategy's last messages land and ``fast run`` gets each rank's stop for the job's wall-clock.

At exit the workers are closed only when the script ended normally: a rank ending on an exception must not enter a
collective the others, still training, will never join (the launcher ends the job instead).
"""

from __future__ import annotations

import atexit
import sys
import weakref
from types import TracebackType

from fast_core import Worker

_state = {"registered": False, "failed": False}
_workers: weakref.WeakSet[Worker] = weakref.WeakSet()  # those hvd.DistributedOptimizer made, none other


def shutdown() -> None:
    """Close the FAST workers of this process's Horovod optimizers (collective: every rank calls it)."""
    for worker in list(_workers):
        worker.close()


def shutdown_at_exit(worker: Worker) -> None:
    """Call ``shutdown`` for ``worker`` and the others when the interpreter exits normally."""
    _workers.add(worker)
    if _state["registered"]:
        return
    _state["registered"] = True
    previous = sys.excepthook

    def note_failure(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        _state["failed"] = True
        previous(kind, value, trace)

    sys.excepthook = note_failure
    atexit.register(lambda: None if _state["failed"] else shutdown())
