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

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .agreement import check_same_setup
from .errors import ConfigError, PeerLost
from .strategies.base import GroupChange
from .strategies.spec import canonical_strategy

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


def survive(worker: Worker, error: PeerLost) -> Recovery:
    """Steps 1-4 above on this survivor (collective over the survivors, and the replacements if any are started);
    the caller runs its hook again."""
    detected = time.time()
    engine = worker.engine
    old_world, old_size = engine.world_ranks, engine.size
    log.warning("rank %d (launched as %d): %s", engine.rank, old_world[engine.rank], error)
    worker.strategy.abandon(worker.context)
    if worker.allowance is not None:
        worker.allowance.abandon()
    lost = engine.shrink()
    kept = tuple(old_world.index(w) for w in engine.world_ranks)
    replaced = engine.grow(lost) if engine.restarts_left else ()
    regroup(worker, GroupChange(kept, old_size, lost, engine.size, replaced), member=True)
    recovery = Recovery(lost, replaced, worker.step, engine.size, detected, time.time())
    worker.recoveries.append(recovery)
    if engine.rank == 0:
        log.warning(
            "lost rank(s) %s at step %d; %s %d rank(s) go on (recovered in %.2f s)",
            list(lost),
            recovery.step,
            f"replaced {list(replaced)}," if replaced else "",
            engine.size,
            recovery.recovered_at - detected,
        )
    return recovery


def join(worker: Worker) -> None:
    """A process started to replace lost ranks (``Engine.joined``) joins the group from its Worker's start: the
    same collective steps as the survivors' ``regroup``, taking the survivors' parameters, step and optimizer state
    (from a live rank, not from a file) and its place in the topology and the budget."""
    engine = worker.engine
    replaced = engine.joined
    regroup(worker, GroupChange((), 0, (), engine.size, replaced), member=False)
    engine.joined = ()
    log.info("rank %d joined as launch number %d at step %d", engine.rank, engine.world_ranks[engine.rank], worker.step)


def regroup(worker: Worker, change: GroupChange, member: bool) -> None:
    """Collective over the new group: the consensus point and the strategy's and budget's set-up over it.
    ``member``: this rank was in the group before (False on a replacement)."""
    engine, context = worker.engine, worker.context
    worker.rank, worker.size = engine.rank, engine.size
    if change.replaced:  # the newcomers run the same script: check it like at the start
        worker.strategy.heal_topology(change)
        check_same_setup(worker.layout, canonical_strategy(worker.strategy, shared=True), engine)
    lockstep = member and _in_lockstep(worker)
    claimed = member and worker.claimed_step == context.step  # the hook to run again belongs to a claimed batch
    clocks = np.array(
        [context.step, context.round, lockstep, worker.first_step if member else -1, claimed], dtype=np.int64
    )
    engine.allreduce(clocks, op="max", kind="job")
    if clocks[2] or not member:  # lockstep ranks run the same steps again; asynchronous ones keep their own
        context.step, context.round = int(clocks[0]), int(clocks[1])
        worker.metrics.steps = context.step
    if not member:
        worker.first_step = int(clocks[3])
        change = replace(change, first_step=worker.first_step)
    _average_of_members(worker, member)
    if change.replaced:
        _give_optimizer_state(worker, member)
    worker.strategy.rejoin(context, change)
    if worker.allowance is not None:
        worker.allowance.rejoin(member, mid_step=bool(clocks[4]))


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
    if not worker.engine.fault_tolerant:
        raise error
    if not worker.strategy.survivable:
        raise PeerLost(f"{error}; strategy {worker.strategy.name} cannot go on without the lost rank") from error
    if attempts >= MAX_SHRINKS_IN_A_ROW:
        raise PeerLost(f"{error}; {attempts} losses in a row during recovery, giving up") from error
