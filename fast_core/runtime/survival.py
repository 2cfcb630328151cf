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
import time
from dataclasses import dataclass, replace
from typing import NoReturn

import numpy as np

from fast_core.engine import Engine
from fast_core.engine.capabilities import FaultTolerant, fault_tolerance
from fast_core.errors import ConfigError, PeerLost
from fast_core.model.contract import ModelAdapter
from fast_core.observers.events import Recovered
from fast_core.runtime import uncaught
from fast_core.runtime.agreement import check_same_setup
from fast_core.runtime.budget import Allowance
from fast_core.runtime.clock import set_step
from fast_core.strategies import Strategy
from fast_core.strategies.base import GroupChange, StepContext
from fast_core.strategies.canonical import canonical_strategy
from fast_core.strategies.integrity import NonFiniteError

log = logging.getLogger("fast")

MAX_SHRINKS_IN_A_ROW = 8
"""Losses survived back to back inside one hook (a rank dying during the recovery from another) before giving up."""


@dataclass
class RecoveryState:
    """All that recovery reads and writes: this rank's engine (it shrinks and grows), the strategy and its context
    (the step clock), the budget's allowance (once training started) and the step training started from. The
    Worker's rank and size are its engine's, so nothing else changes when the group does."""

    engine: Engine
    context: StepContext
    strategy: Strategy
    allowance: Allowance | None = None
    first_step: int = 0
    """The step training started (or resumed) from: a strategy's lockstep steps count from it."""

    @property
    def model(self) -> ModelAdapter:
        return self.context.model

    @property
    def step(self) -> int:
        return self.context.step

    @step.setter
    def step(self, value: int) -> None:
        set_step(self.context, value)


def survive(state: RecoveryState, error: PeerLost) -> GroupChange:
    """Steps 1, 2 and the budget's part of 4 on this survivor (collective over the survivors, and the replacements
    if any are started); ``resync`` does the rest, at once or at the end of the step in progress."""
    engine = fault_tolerance(state.engine)
    log.warning("rank %d (launched as %d): %s", engine.rank, engine.world_ranks[engine.rank], error)
    state.strategy.abandon(state.context)
    if state.allowance is not None:
        state.allowance.abandon()
    change = _shrink_and_grow(engine)
    _regroup(state, change, member=True)
    return change


def reform(engine: Engine, error: PeerLost) -> GroupChange:
    """Step 2 alone, for a job with no Worker to recover (Horovod's elastic run over a script's own collectives,
    ``fast_core.interop.elastic``): the survivors shrink the group (collective) and, while restarts are left, take
    in new processes for the lost ranks."""
    engine = fault_tolerance(engine)
    log.warning("rank %d (launched as %d): %s", engine.rank, engine.world_ranks[engine.rank], error)
    return _shrink_and_grow(engine)


def _shrink_and_grow(engine: FaultTolerant) -> GroupChange:
    """The survivors agree on who is gone and renumber (``shrink``; nobody when the group was revoked for workers
    that asked to join), then start new processes (``grow``): for lost ranks while restarts are left, and for the
    workers asked for, within ``max_ranks``."""
    old_world, old_size = engine.world_ranks, engine.size
    lost = engine.shrink()
    kept = tuple(old_world.index(w) for w in engine.world_ranks)
    adding = engine.agreed_growth()
    newcomers = engine.grow(lost, adding) if (lost and engine.restarts_left) or adding else ()
    replaced = tuple(n for n in newcomers if n in lost)
    added = tuple(n for n in newcomers if n not in lost)
    return GroupChange(kept, old_size, lost, engine.size, replaced, added=added)


def leave(state: RecoveryState, error: NonFiniteError) -> NoReturn:
    """This rank's own numbers turned NaN or Inf in a fault-tolerant job: it leaves the group as a lost rank does,
    so that no NaN spreads and the others go on (``--max-restarts`` starts a replacement from their average). It
    records why (``fast run`` names it), then ends as a lost rank (``FaultTolerant.leave``: under MPI its process
    ends with SIGKILL and the others shrink, as after kill -9). Its half-done work is lost with it."""
    engine = fault_tolerance(state.engine)
    launch = engine.world_ranks[engine.rank]
    log.error("rank %d (launched as %d): %s; it leaves the group, which goes on without it", engine.rank, launch, error)
    uncaught.record_leaving(launch, error)
    engine.leave(error)


def leave_behind(state: RecoveryState, error: PeerLost) -> Recovered:
    """A rank lost during the group's start: the survivors shrink the group (collective), a budget's service
    half-started is stopped and the topology healed, for the start to run again over them. Nothing else is
    undone: a strategy whose setup was cut short is set up again from the start (as a Schedule's next phase)."""
    detected = time.time()
    engine = fault_tolerance(state.engine)
    old_world, old_size = engine.world_ranks, engine.size
    log.warning("rank %d (launched as %d), starting: %s", engine.rank, old_world[engine.rank], error)
    if state.allowance is not None:
        state.allowance.abandon()
        state.allowance = None
    lost = engine.shrink()
    kept = tuple(old_world.index(w) for w in engine.world_ranks)
    state.strategy.heal_topology(GroupChange(kept, old_size, lost, engine.size))
    return Recovered(state.step, lost, (), engine.size, detected, time.time())


def join(state: RecoveryState) -> None:
    """A process started to replace lost ranks (``FaultTolerant.joined``) joins the group from its Worker's start:
    the same collective steps as the survivors, taking the members' parameters, step and optimizer state (from a
    live rank, not from a file) and its place in the topology and the budget."""
    engine = fault_tolerance(state.engine)
    change = GroupChange((), 0, (), engine.size, added=engine.joined)
    _regroup(state, change, member=False)
    state.step = resync(state, change, member=False, next_step=-1)
    engine.joined = ()
    if state.allowance is not None:
        state.allowance.first_step = state.first_step
    log.info("rank %d joined as launch number %d at step %d", engine.rank, engine.world_ranks[engine.rank], state.step)


def _regroup(state: RecoveryState, change: GroupChange, member: bool) -> None:
    """The part of a change every rank of the new group does at once: the newcomers' check, the budget."""
    if change.newcomers:  # the newcomers run the same script: check it like at the start
        state.strategy.heal_topology(change)
        check_same_setup(state.model.layout, canonical_strategy(state.strategy, shared=True), state.engine)
    if state.allowance is not None:
        state.allowance.rejoin(member)


def resync(state: RecoveryState, change: GroupChange, member: bool, next_step: int) -> int:
    """Step 3 and the strategy's part of 4 (collective over the new group): returns the step every rank runs next.
    ``next_step``: the one this rank would run next (after the step it was in, if it ends here); lockstep ranks all
    take the largest, asynchronous ones keep theirs, a replacement takes the largest."""
    engine = state.engine
    lockstep = member and _in_lockstep(state)
    clocks = np.array([next_step, lockstep, state.first_step if member else -1], dtype=np.int64)
    engine.allreduce(clocks, op="max", kind="job")
    aligned = int(clocks[0]) if clocks[1] or not member else next_step
    if not member:
        state.first_step = int(clocks[2])
        change = replace(change, first_step=state.first_step)
    _average_of_members(state, member)
    if change.newcomers:
        _give_optimizer_state(state, member)
    state.step = aligned  # the strategy sets up for the step it runs next
    state.strategy.rejoin(state.context, change)
    return aligned


def _average_of_members(state: RecoveryState, member: bool) -> None:
    """Every rank takes the average of the parameters of the ranks that were in the group (a newcomer's own
    start counts for nothing)."""
    engine = state.engine
    total = np.array(state.model.params(), copy=True)
    if not member:
        total.fill(0)
    count = np.array([float(member)])
    engine.allreduce(total, kind="job")
    engine.allreduce(count, kind="job")
    total /= count[0]
    state.model.set_params(total)


def _give_optimizer_state(state: RecoveryState, member: bool) -> None:
    """A live rank's optimizer state (momentum, AdaGrad sums, ...) to the newcomers, for adapters that expose it
    (``optimizer_state``/``load_optimizer_state``): names, shapes and dtypes as JSON, then each array; no pickle."""
    model, engine = state.model, state.engine
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


def _in_lockstep(state: RecoveryState) -> bool:
    """Whether the step being run is one every rank runs together (a lockstep strategy or warm-up phase)."""
    try:
        steps = state.strategy.lockstep_steps()
    except ConfigError:  # a lockstep phase after an asynchronous one: no budget needs the count
        return state.strategy.lockstep
    return state.step - state.first_step < steps


def check_can_survive(state: RecoveryState, error: PeerLost, attempts: int) -> None:
    """Re-raise ``error`` where the job cannot go on: the engine is not fault tolerant, the strategy says it cannot
    survive, or ranks keep dying during the recovery."""
    if not isinstance(state.engine, FaultTolerant):
        raise error
    if not state.strategy.survivable:
        raise PeerLost(f"{error}; strategy {state.strategy.name} cannot go on without the lost rank") from error
    if attempts >= MAX_SHRINKS_IN_A_ROW:
        raise PeerLost(f"{error}; {attempts} losses in a row during recovery, giving up") from error
