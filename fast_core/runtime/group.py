"""The ranks training together, as one rank sees them: collectives over the whole group that survive a lost rank,
the consensus model, and the losses survived (``fast_core.runtime.survival`` does the recovery itself).

A script reaches it as ``worker.group``: ``average_params()`` and ``consensus_distance()`` for the consensus model,
``collective(action)`` for its own communication with every rank (a fault-tolerant job then goes on without a lost
rank), ``recoveries`` for what was survived.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from fast_core.engine import collectives
from fast_core.engine.capabilities import FaultTolerant
from fast_core.errors import PeerLost
from fast_core.observers.events import Recovered
from fast_core.runtime.joins import JoinDesk
from fast_core.runtime.survival import (
    MAX_SHRINKS_IN_A_ROW,
    RecoveryState,
    check_can_survive,
    join,
    leave,
    leave_behind,
    resync,
    survive,
)
from fast_core.strategies.base import GroupChange
from fast_core.strategies.integrity import NonFiniteError, finite_average

log = logging.getLogger("fast")
T = TypeVar("T")


class Group:
    """This rank's view of the group, and the one path by which a lost rank is survived (``announce`` tells the
    observers of each recovery)."""

    def __init__(
        self, state: RecoveryState, announce: Callable[[Recovered], None], desk: JoinDesk | None = None
    ) -> None:
        self.state = state
        self.desk = desk
        """Where rank 0 takes in workers that ask to join (``fast run --join``), when the job may grow."""
        self.recoveries: list[Recovered] = []
        """The losses of ranks this worker survived (a fault-tolerant engine), in order."""
        self._announce = announce
        self._change: GroupChange | None = None  # a loss survived, its consensus point still to come
        self._unstarted: list[Recovered] = []  # ranks lost during the start, announced once it is
        self._detected = 0.0
        self.defer_losses = False
        """Set while Horovod's elastic run owns recovery (``fast_core.interop.elastic``): a rank lost in a strategy's
        hook is not survived there; its PeerLost ends the step and reaches the run loop, which calls ``recover`` and
        goes back to the last commit."""

    # what scripts use ---------------------------------------------------------------------------------------------
    def collective(self, action: Callable[[], T]) -> T:
        """Run ``action``, communication every rank of the job takes part in (a hook's, or the script's own
        averages); when the engine reports a lost rank and the job can go on (a fault-tolerant engine), survive it
        and run ``action`` again over the group after. ``action`` must leave its inputs as they were when it fails
        (the engines' collectives do)."""
        for attempt in itertools.count():
            try:
                return action()
            except PeerLost as error:
                self._lost(error, attempt)
                self.state.step = self._recover(self.state.step)
            except NonFiniteError as error:  # fault tolerant: the ranks it names leave, the others run it again
                if not self._leaves_over(error) or attempt >= MAX_SHRINKS_IN_A_ROW:
                    raise
        raise AssertionError("unreachable")

    def average_params(self) -> np.ndarray:
        """The mean of all ranks' parameters (one allreduce), as a new buffer: the model is left as it is, so it
        also evaluates the consensus model mid-training. Collective: every rank must call it at the same point;
        under an asynchronous strategy that makes the ranks wait for each other (the slowest sets the pace there)."""
        state = self.state  # NaN or Inf anywhere: NonFiniteError on every rank, naming the ranks, never a NaN model
        return self.collective(lambda: finite_average(state.model, state.engine))

    def consensus_distance(self) -> float:
        """(1/N) sum_i ||x_i - x_bar||^2, the spread decentralized methods keep small; every rank must call it.
        The records that follow carry it."""
        state = self.state
        value = self.collective(lambda: collectives.consensus_distance(state.model, state.engine))
        state.context.metrics.consensus_distance = value
        return value

    # what the Worker uses -----------------------------------------------------------------------------------------
    @property
    def changing(self) -> bool:
        """A loss was survived inside this step: the rest of it exchanges nothing until its consensus point."""
        return self._change is not None

    def in_step(self, hook: Callable[[], None]) -> None:
        """A strategy's hook: a rank lost in it is survived, and the rest of the step exchanges nothing (it ends at
        the consensus point, ``end_step``)."""
        try:
            hook()
        except PeerLost as error:
            if self.defer_losses:
                raise
            self._lost(error, 0)
        except NonFiniteError as error:
            if not self._leaves_over(error):
                raise

    def recover(self, error: PeerLost, attempt: int = 0) -> None:
        """Survive ``error``, raised outside this group's own calls (Horovod's elastic run: a script's collective, or
        a hook under ``defer_losses``), at once: the recovery ``collective`` runs, ending at the consensus point.
        ``attempt``: losses survived back to back before this one."""
        self._lost(error, attempt)
        self.state.step = self._recover(self.state.step)

    def admit_joiners(self) -> None:
        """From each step: on rank 0, take workers that asked to join (about once a second); the group's next call
        then meets the change on every rank, survived as a loss is."""
        if self.desk is not None:
            self.desk.poll()

    def end_step(self, next_step: int) -> int:
        """The step to run next: ``next_step``, or after a loss in this step the group's consensus point's."""
        return next_step if self._change is None else self._recover(next_step)

    def start(self, start: Callable[[], None]) -> None:
        """Run the group's start, ``start`` (collective: the setup check, the start broadcast, the strategy's
        setup, the budget); a rank lost in it (a fault-tolerant engine) is left behind and the survivors start
        again without it. No replacement is started: there is no running group yet for one to join, and nothing
        trained is lost (``--max-restarts`` is kept for losses in training)."""
        for attempt in itertools.count():
            try:
                start()
                return
            except PeerLost as error:
                check_can_survive(self.state, error, attempt)
                self._unstarted.append(leave_behind(self.state, error))

    def started(self) -> None:
        """The start is announced: now tell the observers of the ranks it left behind (after the start's record)."""
        for recovery in self._unstarted:
            self.recoveries.append(recovery)
            self._announce(recovery)
            self._say(recovery)
        self._unstarted.clear()

    def join(self) -> None:
        """Start as a replacement of lost ranks (a process ``FaultTolerant.grow`` started): join the running group,
        taking its parameters, step, optimizer state and budget share."""
        join(self.state)

    # ---------------------------------------------------------------------------------------------------------------
    def _leaves_over(self, error: NonFiniteError) -> bool:
        """Under a fault-tolerant engine, a rank whose numbers ``error`` names leaves the job (``survival.leave``)
        and True is returned on the others, whose next call then meets its loss; False otherwise (no fault
        tolerance, or nobody named): the error then ends the job."""
        engine = self.state.engine
        if not isinstance(engine, FaultTolerant) or not error.ranks or not self.state.strategy.survivable:
            return False
        if engine.rank in error.ranks:
            leave(self.state, error)
        return True

    def _lost(self, error: PeerLost, attempt: int) -> None:
        check_can_survive(self.state, error, attempt)
        if self._change is None:
            self._detected = time.time()
        change = survive(self.state, error)
        self._change = change if self._change is None else self._change.then(change)

    def _recover(self, next_step: int) -> int:
        """The consensus point after a loss (collective): the step to run next; losses meanwhile are survived."""
        for attempt in itertools.count(1):
            try:
                step = resync(self.state, self._change, member=True, next_step=next_step)
                break
            except PeerLost as error:
                self._lost(error, attempt)
        size, change = self.state.engine.size, self._change
        recovery = Recovered(step, change.lost, change.replaced, size, self._detected, time.time(), change.added)
        self._change = None
        if self.desk is not None and self.state.engine.rank == 0:
            self.desk.answer(change.added, step)
        self.recoveries.append(recovery)
        self._announce(recovery)
        self._say(recovery)
        return step

    def _say(self, recovery: Recovered) -> None:
        if self.state.engine.rank == 0:
            lost = f"lost rank(s) {list(recovery.lost)}; " if recovery.lost else ""
            replaced = f"replaced {list(recovery.replaced)}, " if recovery.replaced else ""
            joined = f"rank(s) {list(recovery.joined)} joined, " if recovery.joined else ""
            log.warning(
                "%s%s%s%d rank(s) go on from step %d (the group changed in %.2f s)",
                lost,
                replaced,
                joined,
                recovery.size,
                recovery.step,
                recovery.recovered_at - recovery.detected_at,
            )
