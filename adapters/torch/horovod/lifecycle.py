"""Horovod's shutdown, also at exit as Horovod does it: the FAST workers of this process are closed (collective),
so an asynchronous strategy's last messages land and ``fast run`` gets each rank's stop for the job's wall-clock.

At exit the workers are closed only when the script ended normally: a rank ending on an exception must not enter a
collective the others, still training, will never join (the launcher ends the job instead).
"""

from __future__ import annotations

import atexit
import sys
from types import TracebackType

from ..optimizer import _WORKERS

_state = {"registered": False, "failed": False}


def shutdown() -> None:
    """Close the FAST workers this process trains (collective: every rank calls it)."""
    for worker in list(_WORKERS.values()):
        worker.close()


def shutdown_at_exit() -> None:
    """Call ``shutdown`` when the interpreter exits normally (registered once)."""
    if _state["registered"]:
        return
    _state["registered"] = True
    previous = sys.excepthook

    def note_failure(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        _state["failed"] = True
        previous(kind, value, trace)

    sys.excepthook = note_failure
    atexit.register(lambda: None if _state["failed"] else shutdown())
