"""A rank's heartbeat to its guard (``fast run --freeze-timeout``): the sign that the process still runs.

A frozen rank (stopped with SIGSTOP, or hung with the interpreter held) is not a dead one: MPI with ULFM only
declares dead processes failed, so the others would wait for it until their timeout and the job would end. Its
guard, the small parent ``fast run`` starts above each rank (``fast_core/cli/guard.py``), watches a pipe this thread
writes a byte to every ``BEAT_SECONDS``; after the bound without one it kills the rank, which the survivors then
recover from like any lost rank, every one naming the same rank (ULFM's agreement on the failed).
"""

from __future__ import annotations

import os
import threading
import time

BEAT_SECONDS = 0.5
"""Seconds between beats: well under any sensible bound (a bound of a few seconds still sees several)."""


def start_heartbeat(fd: int) -> threading.Thread:
    """Beat on ``fd`` (the pipe the guard gave, FAST_HEARTBEAT_FD) from a daemon thread until the pipe closes."""
    os.set_inheritable(fd, False)  # the rank's own subprocesses are not watched

    def beat() -> None:
        while True:
            try:
                os.write(fd, b".")
            except OSError:  # the guard is gone (the job is ending): nobody listens
                return
            time.sleep(BEAT_SECONDS)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread
