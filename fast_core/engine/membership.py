"""Who is lost in a fault-tolerant in-process job (``LocalCluster(fault_tolerant=True)``), and the survivors' shrink.

A loss belongs to a launched rank (a thread standing for a process), not to one group, so one ``Membership`` is
shared by every cluster of the job: the one launched, those dup'ed from it and those a shrink makes for the
survivors. Each cluster knows its ``members`` (launch numbers). A cluster with a lost member is revoked, as ULFM's
``MPI_Comm_revoke`` would leave it: from the moment of the loss, every operation it starts raises PeerLost on every
survivor (one already pending completes only if all it needs was delivered before; see local.py), so a rank that
never talks to the lost one learns of it at its next call. A lost rank's own engines refuse every call with
PeerFailed (a killed process makes none; it is not told to shrink).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from fast_core.errors import PeerFailed, PeerLost, PeerTimeout


class Membership:
    """The lost ranks of one job (launch number -> the exception that ended it), in the order they were lost, and its
    growth: the groups revoked for workers that asked to join, and the launch numbers given so far."""

    def __init__(self, size: int = 0, max_ranks: int = 0) -> None:
        self._lock = threading.Lock()
        self._lost: dict[int, BaseException] = {}
        self._conditions: weakref.WeakSet[threading.Condition] = weakref.WeakSet()
        self.launched = size
        """Launch numbers given so far: the next one a worker that joins takes."""
        self.max_ranks = max_ranks
        """The most ranks a group may grow to (``FaultTolerant.max_ranks``)."""
        self.revocations = 0
        """How many groups were revoked with nobody lost (a cluster made before revocation N may be revoked by it)."""
        self._revoked: list[tuple[int, tuple[int, ...], str]] = []  # (revocation number, members, why)
        self.start_newcomer: Callable[[Any], None] | None = None
        """Set by ``LocalCluster.run``: starts a thread running the job's function on a joining rank's engine."""

    def revoke(self, members: tuple[int, ...], reason: str) -> None:
        """Revoke every cluster of ``members`` made so far, nobody lost (workers asked to join): their operations
        raise PeerLost until the members shrink, as after a loss."""
        with self._lock:
            self.revocations += 1
            self._revoked.append((self.revocations, members, reason))
            conditions = list(self._conditions)
        for condition in conditions:
            with condition:
                condition.notify_all()

    def watch(self, condition: threading.Condition) -> None:
        """Wake the waiters of ``condition`` (a cluster's) whenever a rank is lost."""
        with self._lock:
            self._conditions.add(condition)

    def lose(self, launch: int, exc: BaseException) -> bool:
        """Record ``launch`` as lost by ``exc`` (a second loss of it is ignored: the first cause stays) and wake
        every waiter of the job; True when it was new."""
        with self._lock:
            if launch in self._lost:
                return False
            self._lost[launch] = exc
            conditions = list(self._conditions)
        for condition in conditions:  # taken one at a time, never under self._lock: no lock-order cycle
            with condition:
                condition.notify_all()
        return True

    @property
    def lost(self) -> dict[int, BaseException]:
        with self._lock:
            return dict(self._lost)

    def lost_among(self, members: Sequence[int]) -> tuple[int, ...]:
        if not self._lost:  # the common case, without the lock
            return ()
        with self._lock:
            return tuple(m for m in members if m in self._lost)

    def check(self, members: Sequence[int], me: int | None, born: int = 0) -> None:
        """Raise PeerFailed when ``me`` is lost, PeerLost when a member of the group is or when the group (a cluster
        of ``members`` made at revocation ``born``) was revoked since; nothing otherwise."""
        if self.revocations > born:
            with self._lock:
                why = next((r for n, m, r in self._revoked if n > born and m == tuple(members)), None)
            if why is not None:
                who = "" if me is None else f"rank {me}: "
                raise PeerLost(f"{who}the group was revoked ({why}); it changes once every member calls shrink()")
        if not self._lost:
            return
        with self._lock:
            if me is not None and me in self._lost:
                raise PeerFailed(
                    f"launch rank {me} is lost ({_summary(self._lost[me])}); its engines refuse every call, as a "
                    "killed process makes none"
                )
            gone = tuple(m for m in members if m in self._lost)
            if gone:
                causes = "; ".join(f"rank {m}: {_summary(self._lost[m])}" for m in gone[:3])
                who = "" if me is None else f"rank {me}: "
                raise PeerLost(
                    f"{who}launch rank(s) {list(gone)} of this group are lost ({causes}); every operation of the "
                    "group raises PeerLost until the survivors call shrink()",
                    ranks=gone,
                )


class Shrink:
    """One group's shrink: every survivor arrives; the last to arrive decides for all, once, under the group's lock.

    The decision is the set of members lost at that moment and a new cluster for the others (in their old order).
    A member lost before the decision, even one that had already arrived, is not waited for and counts as lost in
    this shrink; one lost after it is a member of the new cluster, which is then revoked at once, so the survivors'
    next call raises PeerLost again and they shrink again. Every survivor thus returns the same lost set.
    """

    def __init__(self, members: tuple[int, ...], membership: Membership) -> None:
        self.members = members
        self.membership = membership
        self.arrived: set[int] = set()
        self.decision: tuple[tuple[int, ...], tuple[int, ...], Any] | None = None

    def join(
        self,
        condition: threading.Condition,
        index: int,
        timeout: float,
        make: Callable[[tuple[int, ...]], Any],
    ) -> tuple[tuple[int, ...], int, Any]:
        """Arrive as member number ``index``; return (launch numbers lost, this rank's new index, the new cluster
        made by ``make(survivors)``). Raises PeerTimeout naming (by launch number) the survivors that never came."""
        me = self.members[index]
        deadline = time.monotonic() + timeout
        with condition:
            self.arrived.add(me)
            while self.decision is None:
                self.membership.check((), me)  # lost while waiting: gone at once, like the rest of its calls
                lost = self.membership.lost_among(self.members)
                survivors = tuple(m for m in self.members if m not in lost)
                missing = [m for m in survivors if m not in self.arrived]
                if not missing:
                    self.decision = (lost, survivors, make(survivors))
                    condition.notify_all()
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerTimeout(
                        f"launch rank {me} waited {timeout:g} s in shrink for launch rank(s) {missing}, survivors "
                        "that never joined it (still computing without calling the engine, or stuck)",
                        ranks=tuple(missing),
                    )
                condition.wait(min(left, 0.05))
            lost, survivors, cluster = self.decision
        if me not in survivors:  # cannot happen for a live caller: the check above raised first
            raise PeerFailed(f"launch rank {me} was lost before the shrink decided; it is not among the survivors")
        return lost, survivors.index(me), cluster


def _summary(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:120]}{'...' if len(text) > 120 else ''}"
