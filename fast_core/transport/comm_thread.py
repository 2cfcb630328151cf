"""The background thread every asynchronous strategy communicates through.

Large MPI messages only progress inside MPI calls (design.md section 3), so a thread that polls the engine keeps
transfers moving while the trainer computes. It works on its own duplicate of the engine, so its messages never
mix with the trainer's. Closing is collective and cannot strand a peer: a closing rank stops starting new
work, finishes what it started, enters a nonblocking barrier, and keeps serving peers until every rank is there.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

from fast_core.engine import Engine, Request
from fast_core.errors import FastError, PeerLost, PeerTimeout

_FIRST_PAUSE = 1e-4
"""An idle thread's first sleep between polls (seconds); each next one doubles it, up to ``idle_pause``."""
_WAITED_PAUSE = 1e-3
"""The longest sleep between polls while the trainer waits for an arrival."""


class CommThread:
    """Base class: runs ``_progress`` in a loop until a collective ``close``; subclasses do the messaging."""

    idle_pause = _WAITED_PAUSE
    """The longest sleep of an idle thread between polls (seconds): the delay before it notices an arrival, and
    what it costs idle (a wake-up per pause, taken from the trainers on shared cores). A subclass whose arrivals
    the trainer rarely waits for (fresh parameters, not replies) may sleep longer; while the trainer waits
    (``_waiting``) the thread polls at most ``_WAITED_PAUSE`` apart. The trainer wakes it when it stages work."""

    def __init__(self, engine: Engine, name: str) -> None:
        if not engine.threads_supported:
            raise FastError(
                f"rank {engine.rank}: {name} needs a communication thread, but the MPI library granted only "
                f"{engine.thread_level}, not MPI_THREAD_MULTIPLE; use an MPI library built with thread support "
                "(e.g. pip install mpich) or a synchronous strategy"
            )
        self.engine = engine.dup()
        self.rank = engine.rank
        self.name = name
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._waiting = 0  # trainer waits in progress (changed under _cond): poll faster meanwhile
        self._closing = False
        self._abandoned = False
        self._error: BaseException | None = None
        self._barrier: Request | None = None  # the closing barrier, once entered
        self._stopped = False  # cooperative: the last turn ran
        self._thread = threading.Thread(target=self._run, name=f"fast-{name}-rank{self.rank}", daemon=True)

    def _start(self) -> None:
        if self.engine.cooperative:  # virtual time (fast simulate): the engine runs our work as its events
            self.engine.attach_pump(self._pump)
            return
        self._thread.start()

    def _pump(self) -> bool:
        """One turn of the loop, run by a cooperative engine when something landed; False once stopped."""
        if self._stopped or self._abandoned:
            return False
        try:
            stop, _ = self._turn()
            if stop:
                self._shutdown()
        except BaseException as exc:  # noqa: BLE001 - surfaced to the trainer by _raise_if_failed
            stop = True
            with self._cond:
                self._error = exc
        if stop:
            self._stopped = True
        return not stop

    def _wait_on_thread(self, seconds: float) -> None:
        """The trainer waits (holding ``_cond``) for the thread to change something; cooperative: for the next event
        of its rank, the lock released meanwhile."""
        if not self.engine.cooperative:
            self._cond.wait(seconds)
            return
        self._cond.release()
        try:
            self.engine.idle()
        finally:
            self._cond.acquire()

    # to be provided by subclasses ---------------------------------------------------------------------------------
    def _progress(self) -> bool:
        """Test and advance this thread's requests; True if anything happened."""
        raise NotImplementedError

    def _ready_to_close(self) -> bool:
        """True once this rank, closing, has nothing of its own in flight (called only while closing)."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        """Cancel the receives still posted, after every rank has closed."""
        raise NotImplementedError

    # shared machinery -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop starting work, let every rank's last messages land, then stop the thread (collective)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._nudge()
        if self.engine.cooperative:
            while not self._stopped:
                self.engine.idle()
            self._raise_if_failed()
            return
        self._thread.join(None if math.isinf(self.engine.timeout) else self.engine.timeout + 5.0)
        if self._thread.is_alive():
            raise PeerTimeout(
                f"rank {self.rank}: {self.name} did not shut down within {self.engine.timeout:g} s; "
                "some rank never closed its own (every rank must call close)"
            )
        self._raise_if_failed()

    def abandon(self) -> None:
        """Stop at once, with no collective: the group lost a rank and its communicators are revoked (a
        fault-tolerant engine). What was in flight is dropped; the strategy makes a new thread over the survivors."""
        self._abandoned = True
        if self.engine.cooperative:
            return
        self._nudge()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _nudge(self) -> None:
        """Wake the idle thread now: the trainer staged work (a message, a request, the close)."""
        if self.engine.cooperative:
            self.engine.nudge()
            return
        self._wake.set()

    def _raise_if_failed(self) -> None:
        if isinstance(self._error, PeerLost):  # the trainer survives it: it must see it as it is
            raise PeerLost(f"rank {self.rank}: {self.name}: {self._error}") from self._error
        if self._error is not None:
            raise FastError(f"rank {self.rank}: {self.name} communication thread failed: {self._error}") from (
                self._error
            )

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - surfaced to the trainer by _raise_if_failed
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _turn(self) -> tuple[bool, bool]:
        """One pass of the loop: (stop, progressed). Closing, it enters the barrier once nothing of its own is in
        flight; once the barrier completes, every rank's messages have landed."""
        self.engine.check_alive()  # in-process: another worker's failure stops this thread, and so its trainer
        progressed = self._progress()
        if self._closing and self._barrier is None and self._ready_to_close():
            self._barrier = self.engine.ibarrier()
        return self._barrier is not None and self._barrier.test(), progressed

    def _loop(self) -> None:
        pause = 0.0
        while not self._abandoned:
            stop, progressed = self._turn()
            if stop:
                break
            if progressed:
                pause = 0.0
            else:
                self._wake.wait(pause)
                self._wake.clear()
                pause = min(_WAITED_PAUSE if self._waiting else self.idle_pause, pause * 2 + _FIRST_PAUSE)
        if not self._abandoned:
            self._shutdown()

    def _check_delivery(self, sends: Sequence[Request], started: float) -> bool:
        """True when all ``sends`` completed; PeerTimeout naming the receivers once they took too long."""
        if all(r.test() for r in sends):
            return True
        if time.monotonic() - started > self.engine.timeout:
            waiting = sorted({r.peer for r in sends if not r.done})
            raise PeerTimeout(
                f"rank {self.rank}: {self.name} could not deliver to rank(s) {waiting} within "
                f"{self.engine.timeout:g} s; they stopped receiving (dead, stuck, or closed early)",
                ranks=tuple(waiting),
            )
        return False
