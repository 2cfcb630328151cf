"""The background work every asynchronous strategy communicates through.

Large MPI messages only progress inside MPI calls (design.md section 3), so a thread that polls the engine keeps
transfers moving while the trainer computes; small ones need no such help, and their turns can run on the
trainer's own calls instead (``inline``, ``drivers.InlineDriver``). It works on its own duplicate of the engine, so
its messages never mix with the trainer's. Closing is collective and cannot strand a peer: a closing rank stops
starting new work, finishes what it started, enters a nonblocking barrier, and keeps serving peers until every rank
is there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from fast_core.engine import Engine, Request
from fast_core.errors import FastError, PeerLost, PeerTimeout
from fast_core.transport.drivers import WAITED_PAUSE, driver_for


class CommThread:
    """Base class: runs ``_progress`` turn after turn until a collective ``close``; subclasses do the messaging. A
    driver chosen once (``drivers.driver_for``) runs the turns: a thread of its own on real time, or the trainer's
    thread at its calls with a slow backstop thread (``inline=True``), or the engine's own events on virtual time."""

    idle_pause = WAITED_PAUSE
    """The longest sleep of an idle thread between polls (seconds): the delay before it notices an arrival, and
    what it costs idle (a wake-up per pause, taken from the trainers on shared cores). A subclass whose arrivals
    the trainer rarely waits for (fresh parameters, not replies) may sleep longer; while the trainer waits
    (``waited_on``) the thread polls at most ``drivers.WAITED_PAUSE`` apart. The trainer wakes it when it stages
    work."""

    def __init__(self, engine: Engine, name: str, *, inline: bool = False) -> None:
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
        self._waiting = 0  # trainer waits in progress (changed under _cond): poll faster meanwhile
        self._closing = False
        self._abandoned = False
        self._error: BaseException | None = None
        self._barrier: Request | None = None  # the closing barrier, once entered
        self._stopped = False  # the last turn ran
        self.inline = inline
        """Whether the turns run on the trainer's calls (a backstop thread only when it makes none)."""
        self._driver = driver_for(self, self.engine, inline)

    def _start(self) -> None:
        self._driver.start()

    def advance(self) -> tuple[bool, bool]:
        """One turn, for the driver: (still running, progressed). The last turn (every rank closed) cancels the
        receives still posted; an error ends the turns and reaches the trainer at its next call."""
        if self._stopped or self._abandoned:
            return False, False
        try:
            stop, progressed = self._turn()
            if stop:
                self._shutdown()
        except BaseException as exc:  # noqa: BLE001 - surfaced to the trainer by _raise_if_failed
            stop, progressed = True, False
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        if stop:
            self._stopped = True
        return not stop, progressed

    @property
    def waited_on(self) -> bool:
        """True while the trainer waits for this thread to change something."""
        return self._waiting > 0

    @property
    def stopped(self) -> bool:
        """True once the last turn ran (every rank closed, or the thread failed)."""
        return self._stopped

    def poll(self) -> None:
        """Run the due turns now if no thread runs them (inline): before the trainer reads what they delivered."""
        self._driver.poll()

    def _wait_on_thread(self, seconds: float) -> None:
        """The trainer waits (holding ``_cond``) up to ``seconds`` for the thread to change something."""
        self._driver.wait(self._cond, seconds)

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
        if not self._driver.finish(self.engine.timeout + 5.0):
            raise PeerTimeout(
                f"rank {self.rank}: {self.name} did not shut down within {self.engine.timeout:g} s; "
                "some rank never closed its own (every rank must call close)"
            )
        self._raise_if_failed()

    def abandon(self) -> None:
        """Stop at once, with no collective: the group lost a rank and its communicators are revoked (a
        fault-tolerant engine). What was in flight is dropped; the strategy makes a new thread over the survivors."""
        self._abandoned = True
        with self._cond:
            self._cond.notify_all()
        self._driver.abandon()

    def _nudge(self) -> None:
        """Run a turn soon: the trainer staged work (a message, a request, the close)."""
        self._driver.wake()

    def _raise_if_failed(self) -> None:
        if isinstance(self._error, PeerLost):  # the trainer survives it: it must see it as it is
            raise PeerLost(f"rank {self.rank}: {self.name}: {self._error}") from self._error
        if self._error is not None:
            raise FastError(f"rank {self.rank}: {self.name} communication thread failed: {self._error}") from (
                self._error
            )

    def _turn(self) -> tuple[bool, bool]:
        """One pass of the loop: (stop, progressed). Closing, it enters the barrier once nothing of its own is in
        flight; once the barrier completes, every rank's messages have landed."""
        self.engine.check_alive()  # in-process: another worker's failure stops this thread, and so its trainer
        progressed = self._progress()
        if self._closing and self._barrier is None and self._ready_to_close():
            self._barrier = self.engine.ibarrier()
        return self._barrier is not None and self._barrier.test(), progressed

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
