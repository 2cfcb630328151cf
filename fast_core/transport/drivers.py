"""How a communication thread's work is run: by a thread of its own on real time, or by the engine on virtual time.

A CommThread (comm_thread.py) says what to do, one turn at a time (``advance``); the driver, chosen once from the
engine's capability (``driver_for``), says when turns run and how the trainer waits for them. ``RealTimeDriver``
starts a thread that polls, sleeping a little longer after each idle turn and woken when the trainer stages work.
``VirtualTimeDriver`` hands the turns to a ``VirtualTime`` engine (``fast simulate``), which runs them whenever
something lands for its rank; the trainer's waits then pass virtual time (the engine's ``idle``), not real time.
"""

from __future__ import annotations

import math
import threading
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
        self.wake()
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


def driver_for(work: Work, engine: Engine) -> Driver:
    """The driver of ``work`` on ``engine``: on virtual time when the engine has that capability, else a thread."""
    if isinstance(engine, VirtualTime):
        return VirtualTimeDriver(work, engine)
    return RealTimeDriver(work)
