"""How a Worker goes on when a rank of the job is lost (a fault-tolerant engine: ``fast run --fault-tolerant``).

Every survivor learns of the loss as a ``PeerLost`` from its engine, in whatever it was doing (a collective, a
wait for a neighbour, its communication thread), and runs ``survive`` there:

1. its strategy and the budget's grant service stop their threads, with no collective (``Strategy.abandon``);
2. the engine shrinks the group to the survivors, who agree on who is gone (``FaultTolerant.shrink``);
3. a consensus point: under a lockstep strategy the survivors take the largest step and round any of them reached
   (one may have finished the step the others were in); all take the average of their parameters, so lockstep
   replicas are equal again and push-sum, EASGD's centre and pair averages restart from a common value (what a
   lost rank held or had in flight is lost with it: its weight in push-sum, its half of a pair average, its
   messages);
4. the strategy sets up again over the survivors on the healed topology (``Strategy.rejoin``), and the budget's
   counter moves to the survivors' rank 0, who take over the lost ranks' share (``Allowance.rejoin``);
5. where the loss interrupted a step (a strategy's hook), the rest of that step exchanges nothing and steps 3 and 4
   end it, so every survivor meets the consensus point once, wherever it was: a rank that had completed a
   collective the others had not simply ends its step; with plain SGD the average of the survivors' local steps is
   the step all-reduce would have taken. Elsewhere (a budget claim, ``close``, a script's own collectives) the
   consensus point comes at once and the interrupted call runs again over the survivors.

What is not carried over: a lost rank's data shard (the survivors keep their own shards; with shuffled, identically
distributed shards the loss is a smaller sample), and the optimizer state of a survivor that was one step behind
(its momentum misses that step; the difference decays with the momentum).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from fast_core.engine.capabilities import FaultTolerant, fault_tolerance
from fast_core.errors import ConfigError, PeerLost
from fast_core.runtime.agreement import check_same_setup
from fast_core.strategies.base import GroupChange
from fast_core.strategies.canonical import canonical_strategy

if TYPE_CHECKING:
    from fast_core.runtime.worker import Worker

log = logging.getLogger("fast")

MAX_SHRINKS_IN_A_ROW = 8
"""Losses survived back to back inside one hook (a rank dying during the recovery from another) before giving up."""


@dataclass(frozen=True)
class Recovery:
    """One loss survived, as the run records report it."""

    lost: tuple[int, ...]
    """Launch numbers of the ranks lost."""
    replaced: tuple[int, ...]
    """Launch numbers whose ranks new processes took over (``fast run --max-restarts``)."""
    step: int
    """The step the group goes on from."""
    size: int
    """The group's size after the recovery."""
    detected_at: float
    """``time.time()`` when this rank learned of the loss (its PeerLost)."""
    recovered_at: float
    """``time.time()`` when it went on training."""

    def as_record(self) -> dict[str, float | int | str]:
        return {
            "lost": ",".join(map(str, self.lost)),
            "replaced": ",".join(map(str, self.replaced)),
            "step": self.step,
            "size": self.size,
            "detected_at": self.detected_at,
            "recovery_seconds": self.recovered_at - self.detected_at,
        }


def survive(worker: Worker, error: PeerLost) -> GroupChange:
    """Steps 1, 2 and the budget's part of 4 on this survivor (collective over the survivors, and the replacements
    if any are started); ``resync`` does the rest, at once or at the end of the step in progress."""
    engine = fault_tolerance(worker.engine)
    old_world, old_size = engine.world_ranks, engine.size
    log.warning("rank %d (launched as %d): %s", engine.rank, old_world[engine.rank], error)
    worker.strategy.abandon(worker.context)
    if worker.allowance is not None:
        worker.allowance.abandon()
    lost = engine.shrink()
    kept = tuple(old_world.index(w) for w in engine.world_ranks)
    replaced = engine.grow(lost) if engine.restarts_left else ()
    change = GroupChange(kept, old_size, lost, engine.size, replaced)
    _regroup(worker, change, member=True)
    return change


def join(worker: Worker) -> None:
    """A process started to replace lost ranks (``FaultTolerant.joined``) joins the group from its Worker's start: the
    same collective steps as the survivors, taking the members' parameters, step and optimizer state (from a live
    rank, not from a file) and its place in the topology and the budget."""
    engine = fault_tolerance(worker.engine)
    change = GroupChange((), 0, (), engine.size, engine.joined)
    _regroup(worker, change, member=False)
    worker.step = resync(worker, change, member=False, next_step=-1)
    engine.joined = ()
    log.info("rank %d joined as launch number %d at step %d", engine.rank, engine.world_ranks[engine.rank], worker.step)


def _regroup(worker: Worker, change: GroupChange, member: bool) -> None:
    """The part of a change every rank of the new group does at once: the newcomers' check, the budget."""
    engine = worker.engine
    worker.rank, worker.size = engine.rank, engine.size
    if change.replaced:  # the newcomers run the same script: check it like at the start
        worker.strategy.heal_topology(change)
        check_same_setup(worker.layout, canonical_strategy(worker.strategy, shared=True), engine)
    if worker.allowance is not None:
        worker.allowance.rejoin(member)


def resync(worker: Worker, change: GroupChange, member: bool, next_step: int) -> int:
    """Step 3 and the strategy's part of 4 (collective over the new group): returns the step every rank runs next.
    ``next_step``: the one this rank would run next (after the step it was in, if it ends here); lockstep ranks all
    take the largest, asynchronous ones keep theirs, a replacement takes the largest."""
    engine, context = worker.engine, worker.context
    lockstep = member and _in_lockstep(worker)
    clocks = np.array([next_step, lockstep, worker.first_step if member else -1], dtype=np.int64)
    engine.allreduce(clocks, op="max", kind="job")
    aligned = int(clocks[0]) if clocks[1] or not member else next_step
    if not member:
        worker.first_step = int(clocks[2])
        change = replace(change, first_step=worker.first_step)
    _average_of_members(worker, member)
    if change.replaced:
        _give_optimizer_state(worker, member)
    worker.step = aligned  # the strategy sets up for the step it runs next
    worker.strategy.rejoin(context, change)
    return aligned


def _average_of_members(worker: Worker, member: bool) -> None:
    """Every rank takes the average of the parameters of the ranks that were in the group (a newcomer's own
    start counts for nothing)."""
    engine = worker.engine
    total = np.array(worker.model.params(), copy=True)
    if not member:
        total.fill(0)
    count = np.array([float(member)])
    engine.allreduce(total, kind="job")
    engine.allreduce(count, kind="job")
    total /= count[0]
    worker.model.set_params(total)


def _give_optimizer_state(worker: Worker, member: bool) -> None:
    """A live rank's optimizer state (momentum, AdaGrad sums, ...) to the newcomers, for adapters that expose it
    (``optimizer_state``/``load_optimizer_state``): names, shapes and dtypes as JSON, then each array; no pickle."""
    model, engine = worker.model, worker.engine
    take, give = getattr(model, "optimizer_state", None), getattr(model, "load_optimizer_state", None)
    if take is None or give is None:
        return
    root = np.array([engine.rank if member else engine.size], dtype=np.int64)
    engine.allreduce(root, op="min", kind="job")
    source = int(root[0])
    arrays = {name: np.ascontiguousarray(a) for name, a in take().items()} if engine.rank == source else {}
    listing = json.loads(
        engine.broadcast_text(json.dumps([[n, list(a.shape), a.dtype.str] for n, a in arrays.items()]), source)
    )
    received = {}
    for name, shape, dtype in listing:
        buffer = arrays[name] if engine.rank == source else np.empty(shape, dtype=np.dtype(dtype))
        engine.broadcast(buffer, source, kind="job")
        received[name] = buffer
    if not member:
        give(received)


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
    if not isinstance(worker.engine, FaultTolerant):
        raise error
    if not worker.strategy.survivable:
        raise PeerLost(f"{error}; strategy {worker.strategy.name} cannot go on without the lost rank") from error
    if attempts >= MAX_SHRINKS_IN_A_ROW:
        raise PeerLost(f"{error}; {attempts} losses in a row during recovery, giving up") from error
