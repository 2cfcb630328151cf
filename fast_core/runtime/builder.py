"""How a Worker is wired: from (model, strategy, engine, run configuration, options) to the parts it holds, so the
Worker itself only keeps the clock and runs the hooks.

The one place that resolves the strategy, wraps the engine in its metering, makes the strategy's context, the
budget's claims, the group (recovery) and the observers the run configuration asks for (a Reporter and a Straggler
under ``fast run``), giving each observer what it needs when it is made.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fast_core.config.current import run_config
from fast_core.config.run import RunConfig
from fast_core.engine import Engine
from fast_core.engine.metered import MeteredEngine
from fast_core.errors import ConfigError
from fast_core.metrics import Metrics
from fast_core.model.contract import ModelAdapter
from fast_core.observers.base import Observer, Observers
from fast_core.observers.fault_injection import NaNOnSignal
from fast_core.observers.reporting import Reporter
from fast_core.observers.straggler import Straggler
from fast_core.runtime.budget import Budget
from fast_core.runtime.claims import Claims
from fast_core.runtime.clock import ComputeClock
from fast_core.runtime.group import Group
from fast_core.runtime.joins import JoinDesk
from fast_core.runtime.recorder import Recorder
from fast_core.runtime.survival import RecoveryState
from fast_core.strategies import Strategy
from fast_core.strategies.base import StepContext
from fast_core.strategies.spec import resolve_strategy


@dataclass(frozen=True)
class Parts:
    """A Worker's parts, wired to each other."""

    strategy: Strategy
    metrics: Metrics
    context: StepContext
    clock: ComputeClock
    observers: Observers
    records: Recorder
    group: Group
    claims: Claims
    profile: bool = False
    """Whether the Worker splits its time by phase (fast_core.runtime.time_split), as the configuration asks."""


def wire(
    model: ModelAdapter,
    strategy: Strategy | str | None,
    engine: Engine,
    config: RunConfig | None = None,
    *,
    observers: Sequence[Observer] | None = None,
    budget: Budget | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
) -> Parts:
    """The parts of one rank's Worker. ``strategy``, ``observers`` and ``budget``: None takes the run
    configuration's (``config``, else this process's: ``fast_core.run_config()``). ``tensorboard``: a folder for
    the records as TensorBoard scalars, in place of the configuration's (``fast run --tensorboard``)."""
    config = config if config is not None else run_config()
    if tensorboard is not None:
        if observers is not None:
            raise ConfigError(
                "give observers= or tensorboard=, not both: add fast_core.observers.reporting.Reporter(rank, None, "
                "10, False, False, tensorboard=DIR) to your observers instead"
            )
        config = replace(config, tensorboard=Path(tensorboard))
    resolved = resolve_strategy(strategy, config)
    metrics = Metrics()
    context = StepContext(MeteredEngine(engine, metrics), model, metrics)
    clock = ComputeClock()
    chosen = Observers(observers if observers is not None else observers_for(config, engine.rank, engine.size))
    if config.inject_faults:  # chaos runs: SIGUSR1 turns this rank's parameters NaN
        chosen.attach(NaNOnSignal(model.params, model.set_params))
    desk = JoinDesk.for_job(config.run_dir, engine)
    group = Group(RecoveryState(engine, context, resolved), chosen.announce, desk)
    claims = Claims(budget if budget is not None else Budget.from_config(config), group)
    records = Recorder(chosen, context, clock)
    return Parts(resolved, metrics, context, clock, chosen, records, group, claims, profile=config.profile)


def observers_for(config: RunConfig, rank: int, size: int) -> list[Observer]:
    """The observers ``config`` asks for on this rank (none when it asks for nothing: nothing to pay)."""
    straggler = Straggler.for_rank(config, rank, size)
    observers: list[Observer] = []
    if config.reporting:
        every, label = config.log_every, config.label
        observers.append(
            Reporter(rank, config.run_dir, every, config.progress, config.verbose, label, straggler, config.tensorboard)
        )
    if straggler is not None:
        observers.append(straggler)
    return observers
