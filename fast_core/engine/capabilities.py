"""What some engines can do besides messaging, asked for by type: ``isinstance(engine, FaultTolerant)``.

The core protocol (``Engine``) is all a strategy needs. Each capability below is an ABC that an engine class
inherits when it has it, so code asks the type once instead of reading a flag:

- ``FaultTolerant``: the job survives a lost rank (the fault-tolerant MPI engine; the engines of
  ``LocalCluster(fault_tolerant=True)``).
- ``VirtualTime``: the engine runs on virtual time and runs its rank's communication work itself (``fast simulate``).
- ``Metered``: the engine counts the traffic and the waits of its rank (``MeteredEngine``).

A wrapper is an instance of every capability of the engine it wraps (``MeteredEngine``), so nobody unwraps to ask.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import NoReturn

import numpy as np

from fast_core.engine.base import Engine
from fast_core.errors import PeerFailed

__all__ = [
    "FaultTolerant",
    "Metered",
    "VirtualTime",
    "count_wait",
    "fault_tolerance",
    "group_changes",
    "joining",
    "world_ranks",
]


class FaultTolerant(Engine):
    """An engine whose job survives a lost rank: it raises PeerLost (not PeerFailed) when a rank is gone, and
    ``shrink`` gives the survivors a working group (MPI with ULFM under ``fast run --fault-tolerant``;
    ``LocalCluster(fault_tolerant=True)``)."""

    restarts_left: int = 0
    """Lost ranks the engine may still replace with new processes (``grow``; ``fast run --max-restarts``)."""
    joined: tuple[int, ...] = ()
    """On a process started to replace lost ranks, until its Worker joined the group: the newcomers' launch
    numbers. Empty otherwise."""
    changes: int = 0
    """How many times this rank's group changed (each ``shrink``, and each ``grow`` that took newcomers in): a
    count to compare, for code that must learn of a change someone else survived (Horovod's elastic commit)."""

    @property
    @abstractmethod
    def world_ranks(self) -> tuple[int, ...]:
        """The rank each current rank had when the job was launched (``shrink`` renumbers the survivors 0..n-1, in
        their old order): messages and run records name ranks by these numbers."""

    @abstractmethod
    def shrink(self) -> tuple[int, ...]:
        """Collective among the survivors, after a PeerLost: agree on who is gone, renumber the survivors 0..n-1
        (in their old order; ``rank`` and ``size`` change in place, so every holder of this engine sees the new
        group) and return the launch numbers (``world_ranks``) of the ranks lost. Engines made by ``dup`` before
        are abandoned: their owners make new ones."""

    max_ranks: int = 0
    """The most ranks the group may grow to when workers ask to join (``fast run --max-ranks``); 0: it never grows."""
    _joiners_asked: int = 0

    def grow(self, replacing: tuple[int, ...], adding: int = 0) -> tuple[int, ...]:
        """Collective over the group after ``shrink``: start new processes for (some of) the launch numbers
        ``replacing`` (lost ranks, while restarts are left) and ``adding`` more under new launch numbers (workers
        that asked to join, ``agreed_growth``), and take them into the group, numbered by launch number. Returns
        the launch numbers the new processes took. Engines that cannot: none."""
        return ()

    def ask_to_grow(self, workers: int) -> None:
        """On one rank: ask the group to take ``workers`` new processes in. The group is revoked as after a loss, so
        every rank meets the change at its next call (PeerLost), shrinks (nobody is lost) and agrees on the number
        (``agreed_growth``) before ``grow``: the one path by which a group changes."""
        self._joiners_asked = max(self._joiners_asked, workers)
        self.revoke(f"{workers} worker(s) asked to join")

    def leave(self, error: BaseException) -> NoReturn:
        """End this rank as a lost one, over ``error`` (its own numbers turned NaN): the others meet its loss and
        go on. Here it raises ``error``, which loses an in-process rank (``LocalCluster.run``); the MPI engine ends
        its process with SIGKILL instead, since a process that exits with an error ends a job under ``fast run``."""
        raise error

    def revoke(self, reason: str) -> None:
        """Revoke the group on every rank (each one's next call raises PeerLost). Engines that cannot grow: no-op."""

    def agreed_growth(self) -> int:
        """Collective after ``shrink``: how many new processes the group takes in now, the largest number any rank was
        asked for (``ask_to_grow``) within ``max_ranks``. A lost rank's ask is lost with it."""
        asked = np.array([self._joiners_asked], dtype=np.int64)
        self._joiners_asked = 0
        self.allreduce(asked, op="max", kind="job")
        return max(0, min(int(asked[0]), self.max_ranks - self.size))


class VirtualTime(Engine):
    """An engine on virtual time (``fast_core.simulate``): a communication thread starts no thread; the engine calls
    its work (``attach_pump``) whenever something lands for its rank, and the trainer's waits on that work go
    through ``idle``."""

    @abstractmethod
    def attach_pump(self, pump: Callable[[], bool]) -> None:
        """Call ``pump`` whenever something lands for this rank, until it returns False."""

    @abstractmethod
    def nudge(self) -> None:
        """Run this rank's pumps soon (the trainer staged work for its communication thread)."""

    @abstractmethod
    def idle(self) -> None:
        """Wait until something lands for this rank (a trainer waiting on its communication thread)."""


class Metered(Engine):
    """An engine that counts its rank's traffic and blocking time (``fast_core.engine.metered``)."""

    @abstractmethod
    def record_wait(self, seconds: float) -> None:
        """Count ``seconds`` the trainer spent waiting on a peer outside the engine (a transport's own wait)."""


def fault_tolerance(engine: Engine) -> FaultTolerant:
    """``engine`` as FaultTolerant, or PeerFailed saying how to run one: without it a job cannot go on without a
    lost rank."""
    if isinstance(engine, FaultTolerant):
        return engine
    raise PeerFailed(
        f"rank {engine.rank}: the {engine.name} engine cannot go on without a lost rank; run with "
        "`fast run --fault-tolerant` (Open MPI with ULFM: pip install 'fast-training[mpi-ft]')"
    )


def world_ranks(engine: Engine) -> tuple[int, ...]:
    """The rank each current rank had at launch (``FaultTolerant.world_ranks``); an engine that cannot lose a rank
    keeps the launch numbering."""
    return engine.world_ranks if isinstance(engine, FaultTolerant) else tuple(range(engine.size))


def group_changes(engine: Engine) -> int:
    """How many times ``engine``'s group changed (``FaultTolerant.changes``); 0 for an engine that cannot lose a
    rank."""
    return engine.changes if isinstance(engine, FaultTolerant) else 0


def joining(engine: Engine) -> tuple[int, ...]:
    """The newcomers' launch numbers when this process replaces lost ranks and has not joined yet, else ()."""
    return engine.joined if isinstance(engine, FaultTolerant) else ()


def count_wait(engine: Engine, seconds: float) -> None:
    """Count ``seconds`` the trainer waited on a peer outside ``engine`` when the engine counts (Metered)."""
    if isinstance(engine, Metered):
        engine.record_wait(seconds)
