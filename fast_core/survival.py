"""How a Worker goes on when a rank of the job is lost (a fault-tolerant engine: ``fast run --fault-tolerant``).

Every survivor learns of the loss as a ``PeerLost`` from its engine, in whatever it was doing (a collective, a
wait for a neighbour, its communication thread), and runs ``survive`` there:

1. its strategy and the budget's grant service stop their threads, with no collective (``Strategy.abandon``);
2. the engine shrinks the group to the survivors, who agree on who is gone (``Engine.shrink``);
3. a consensus point: under a lockstep strategy the survivors take the largest step and round any of them reached
   (one may have finished the step the others were in); all take the average of their parameters, so lockstep
   replicas are equal again and push-sum, EASGD's centre and pair averages restart from a common value (what a
   lost rank held or had in flight is lost with it: its weight in push-sum, its half of a pair average, its
   messages);
4. the strategy sets up again over the survivors on the healed topology (``Strategy.rejoin``), and the budget's
   counter moves to the survivors' rank 0, who take over the lost ranks' share (``Allowance.rejoin``);
5. the hook that was interrupted runs again, over the survivors.

What is not carried over: a lost rank's data shard (the survivors keep their own shards; with shuffled, identically
distributed shards the loss is a smaller sample), and the optimizer state of a survivor that was one step behind
(its momentum misses that step; the difference decays with the momentum).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import collectives
from .errors import ConfigError, PeerLost
from .strategies.base import GroupChange

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger("fast")

MAX_SHRINKS_IN_A_ROW = 8
"""Losses survived back to back inside one hook (a rank dying during the recovery from another) before giving up."""


@dataclass(frozen=True)
class Recovery:
    """One loss survived, as the run records report it."""

    lost: tuple[int, ...]
    """Launch numbers of the ranks lost."""
    step: int
    """The step the survivors go on from."""
    survivors: int
    detected_at: float
    """``time.time()`` when this rank learned of the loss (its PeerLost)."""
    recovered_at: float
    """``time.time()`` when it went on training."""

    def as_record(self) -> dict[str, float | int | str]:
        return {
            "lost": ",".join(map(str, self.lost)),
            "step": self.step,
            "survivors": self.survivors,
            "detected_at": self.detected_at,
            "recovery_seconds": self.recovered_at - self.detected_at,
        }


def survive(worker: Worker, error: PeerLost) -> Recovery:
    """Steps 1-4 above on this survivor (collective over the survivors); the caller runs its hook again."""
    detected = time.time()
    engine, context = worker.engine, worker.context
    old_world, old_size = engine.world_ranks, engine.size
    log.warning("rank %d (launched as %d): %s", engine.rank, old_world[engine.rank], error)
    worker.strategy.abandon(context)
    if worker.allowance is not None:
        worker.allowance.abandon()
    lost = engine.shrink()
    change = GroupChange(tuple(old_world.index(w) for w in engine.world_ranks), old_size, lost)
    worker.rank, worker.size = engine.rank, engine.size
    lockstep = _in_lockstep(worker)
    clocks = np.array([context.step, context.round, lockstep], dtype=np.int64)
    engine.allreduce(clocks, op="max", kind="job")
    if clocks[2]:  # lockstep ranks must run the same steps again; asynchronous ones keep their own counts
        context.step, context.round = int(clocks[0]), int(clocks[1])
        worker.metrics.steps = context.step
    worker.model.set_params(collectives.average_params(worker.model, engine))
    worker.strategy.rejoin(context, change)
    if worker.allowance is not None:
        worker.allowance.rejoin()
    recovery = Recovery(lost, context.step, engine.size, detected, time.time())
    worker.recoveries.append(recovery)
    if engine.rank == 0:
        log.warning(
            "lost rank(s) %s at step %d; %d survivor(s) go on (recovered in %.2f s)",
            list(lost), recovery.step, engine.size, recovery.recovered_at - detected,
        )
    return recovery


def _in_lockstep(worker: Worker) -> bool:
    """Whether the step being run is one every rank runs together (a lockstep strategy or warm-up phase)."""
    try:
        steps = worker.strategy.lockstep_steps()
    except ConfigError:  # a lockstep phase after an asynchronous one: no budget needs the count
        return worker.strategy.lockstep
    return worker.step - worker.first_step < steps


def check_can_survive(worker: Worker, error: PeerLost, attempts: int) -> None:
    """Re-raise ``error`` where the job cannot go on: the engine is not fault tolerant, the strategy says it cannot
    survive, or ranks keep dying during the recovery."""
    if not worker.engine.fault_tolerant:
        raise error
    if not worker.strategy.survivable:
        raise PeerLost(f"{error}; strategy {worker.strategy.name} cannot go on without the lost rank") from error
    if attempts >= MAX_SHRINKS_IN_A_ROW:
        raise PeerLost(f"{error}; {attempts} losses in a row during recovery, giving up") from error
