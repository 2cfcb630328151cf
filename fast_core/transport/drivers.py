"""How a communication thread's work is run: by a thread of its own, by the trainer's own thread, or by the engine
on virtual time.

A CommThread (comm_thread.py) says what to do, one turn at a time (``advance``); the driver, chosen once
(``driver_for``), says when turns run and how the trainer waits for them. ``RealTimeDriver`` starts a thread that
polls, sleeping a little longer after each idle turn and woken when the trainer stages work: a large message then
moves while the trainer computes. ``InlineDriver`` runs them on the trainer's own calls (a post, a take, a wait),
its thread only a backstop that turns every 20 ms, so a rank whose messages are at most a megabyte spends almost no
core, wake-up or GIL hand-over on a thread between its steps (on one core per rank, the threads' polling was the
term that kept asynchronous training below all-reduce: docs/bench_goals.md, issue 29). ``VirtualTimeDriver``
hands the turns to a ``VirtualTime`` engine (``fast simulate``), which runs them whenever something lands for its
rank; the trainer's waits then pass virtual time (the engine's ``idle``), not real time.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from typing import Protocol

from fast_core.engine import Engine
from fast_core.engine.capabilities import VirtualTime

FIRST_PAUSE = 1e-4
"""An idle thread's first sleep between polls (seconds); each next one doubles it, up to the work's ``idle_pause``."""
WAITED_PAUSE = 1e-3
"""The longest sleep between polls while the trainer waits for an arrival."""


class Work(Protocol):
    """What a driver runs: a communication thread's turns."""

    name: str
    rank: int
    idle_pause: float

    def advance(self) -> tuple[bool, bool]:
        """Run one turn: (still running, something happened)."""
        ...

    @property
    def waited_on(self) -> bool:
        """True while the trainer waits for the work to change something."""
        ...

    @property
    def stopped(self) -> bool:
        """True once the last turn ran (every rank closed, or the work failed)."""
        ...


class Driver(ABC):
    """When a communication thread's turns run, and how its trainer waits on them."""

    @abstractmethod
    def start(self) -> None:
        """Start running turns."""

    @abstractmethod
    def wake(self) -> None:
        """Run a turn soon: the trainer staged work (a message, a request, the close)."""

    @abstractmethod
    def wait(self, cond: threading.Condition, seconds: float) -> None:
        """The trainer, holding ``cond``, waits up to ``seconds`` for a turn to change something."""

    @abstractmethod
    def finish(self, seconds: float) -> bool:
        """After the close was staged: wait until the last turn ran; False if turns still run after ``seconds``."""

    @abstractmethod
    def abandon(self) -> None:
        """Stop running turns at once (the work has been told to stop: its next turn does nothing)."""

    def poll(self) -> None:  # noqa: B027 - a hook most drivers need not override
        """The trainer is about to read what turns delivered (a take, a claim): a driver that runs turns on the
        trainer's calls runs them now; the others have nothing to do."""


class RealTimeDriver(Driver):
    """Turns on a daemon thread of their own, polling the engine so that large messages progress while the trainer
    computes: back to back while something happens, then sleeping longer each idle turn (up to the work's
    ``idle_pause``, or ``WAITED_PAUSE`` while the trainer waits), woken early by ``wake``."""

    def __init__(self, work: Work) -> None:
        self._work = work
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"fast-{work.name}-rank{work.rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        cond.wait(seconds)

    def finish(self, seconds: float) -> bool:
        self._thread.join(None if math.isinf(seconds) else seconds)
        return not self._thread.is_alive()

    def abandon(self) -> None:
        self._wake.set()  # the thread's next turn sees the work stopped and ends
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _loop(self) -> None:
        pause = 0.0
        while True:
            running, progressed = self._work.advance()
            if not running:
                return
            if progressed:
                pause = 0.0
                continue
            self._wake.wait(pause)
            self._wake.clear()
            pause = min(WAITED_PAUSE if self._work.waited_on else self._work.idle_pause, pause * 2 + FIRST_PAUSE)


class VirtualTimeDriver(Driver):
    """Turns run by a ``VirtualTime`` engine as its events, at the moment something lands for the rank: what a
    thread that is never short of a core would do. No thread is started; waits pass virtual time."""

    def __init__(self, work: Work, engine: VirtualTime) -> None:
        self._work = work
        self._engine = engine

    def start(self) -> None:
        self._engine.attach_pump(self._pump)

    def _pump(self) -> bool:
        running, _ = self._work.advance()
        return running

    def wake(self) -> None:
        self._engine.nudge()

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        """Until the rank's next event, ``cond`` released meanwhile (the turns run on this very thread)."""
        cond.release()
        try:
            self._engine.idle()
        finally:
            cond.acquire()

    def finish(self, seconds: float) -> bool:
        """Until the last turn ran; the engine's scheduler ends a wait that can never end (a deadlock) itself."""
        while not self._work.stopped:
            self._engine.idle()
        return True

    def abandon(self) -> None:
        """Nothing to stop: the engine calls the work no more once a turn says it stopped."""


class InlineDriver(RealTimeDriver):
    """Turns on the trainer's own thread, whenever it stages work (``wake``), reads what arrived (``poll``), waits or
    closes; a backstop thread runs one only every ``BACKSTOP_PAUSE`` when the trainer makes no call (it sits in a
    blocking collective or a long evaluation while a peer waits for a reply or for a send to complete). Nothing wakes
    between the trainer's steps, takes its core or contends for the GIL: right for messages that cross in one or a
    few MPI calls (shared memory, a socket's buffers), which land at the receiver's next call, at most a step or two
    late. A message of many megabytes over a network would move only during those calls, so it gets a
    ``RealTimeDriver`` instead."""

    BACKSTOP_PAUSE = 0.02
    """The backstop thread's sleep between its turns (seconds)."""
    MAX_TURNS = 8
    """The most turns one call of the trainer runs back to back while they progress."""

    def __init__(self, work: Work) -> None:
        super().__init__(work)
        self._pause = 0.0
        self._busy = threading.Lock()  # one turn at a time, the trainer's or the backstop's
        self._wanted = False  # the trainer found the backstop mid-turn: it runs the trainer's turns after its own
        self._ended = False  # a turn said the work runs no more (closed, failed or abandoned)

    def wake(self) -> None:
        self._turns()

    def poll(self) -> None:
        self._turns()

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        """Turns now; when none progressed, ``cond`` released for a pause that doubles up to ``WAITED_PAUSE`` (reset
        by progress), as a thread polls while its trainer waits."""
        if self._turns():
            self._pause = 0.0
            return
        self._pause = min(WAITED_PAUSE, self._pause * 2 + FIRST_PAUSE)
        cond.wait(min(seconds, self._pause))

    def finish(self, seconds: float) -> bool:
        """Turns until the last one ran (every rank closed), pausing as ``wait`` does; False after ``seconds``."""
        deadline = time.monotonic() + seconds
        pause = threading.Condition()
        with pause:
            while not self._work.stopped and self._thread.is_alive():
                if time.monotonic() > deadline:
                    return False
                self.wait(pause, deadline - time.monotonic())
        self._wake.set()  # the backstop sees the end now, not after its pause
        return super().finish(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while not self._ended and not self._work.stopped:
            self._wake.wait(self.BACKSTOP_PAUSE)
            self._wake.clear()
            self._turns()

    def _turns(self) -> bool:
        """Turns while they progress (at most ``MAX_TURNS``): True if any did. Never waits for the other side's
        turn, which may need a lock the caller holds (a trainer waits holding the work's condition): it asks that
        side to run the turns after its own (``_wanted``), then tries once more."""
        progressed_any = False
        for _ in range(self.MAX_TURNS):
            if not self._busy.acquire(blocking=False):
                self._wanted = True
                if not self._busy.acquire(blocking=False):
                    break  # the other side holds it and will see _wanted once its turn ended
            try:
                self._wanted = False
                running, progressed = self._work.advance()
            finally:
                self._busy.release()
            self._ended = not running
            progressed_any |= progressed
            if not running or not (progressed or self._wanted):
                break
        return progressed_any


def driver_for(work: Work, engine: Engine, inline: bool = False) -> Driver:
    """The driver of ``work`` on ``engine``: on virtual time when the engine has that capability, else on the
    trainer's thread (``inline``) or a thread of its own."""
    if isinstance(engine, VirtualTime):
        return VirtualTimeDriver(work, engine)
    return InlineDriver(work) if inline else RealTimeDriver(work)
