"""A Worker is one rank's training lifecycle: the step clock and the two hooks around the optimizer step.

Adapters call ``before_step`` between backward and the optimizer step and ``after_step`` after it; the strategy
decides what to exchange through a narrow ``StepContext`` (it never sees the Worker). Everything else is a part the
builder (``fast_core.runtime.builder``) wired in and the Worker holds: ``group`` (collectives over every rank, the
consensus model, recovery from a lost rank), ``claims`` (the shared work budget), ``records`` (what the script tells
the observers), ``observers`` (who hears the events), ``metrics`` (counted by a metering engine, not by hand). It
reads no environment variable itself: the run configuration is resolved before it is built.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

from fast_core.config.run import RunConfig
from fast_core.engine import Engine, collectives
from fast_core.engine.capabilities import joining
from fast_core.errors import ConfigError
from fast_core.model.contract import ModelAdapter
from fast_core.observers.base import Observer
from fast_core.observers.events import Closed, ComputeEnded, EpochEnded, Started, StepEnded
from fast_core.runtime.agreement import check_same_setup
from fast_core.runtime.budget import Budget, check_batch_size
from fast_core.runtime.builder import wire
from fast_core.runtime.clock import set_step
from fast_core.runtime.time_split import TimeSplit
from fast_core.strategies import Strategy
from fast_core.strategies.canonical import canonical_strategy

log = logging.getLogger("fast")


class Worker:
    """One rank's training: model adapter, strategy, engine and step clock, with the parts the builder wired.

    ``strategy``: a Strategy, a strategy string, or None for the run configuration's (``fast run --strategy``,
    else all-reduce). ``observers``: None takes those the run configuration asks for (a reporter and a straggler
    under ``fast run``); pass a list (maybe empty) to choose. ``budget``: a shared work budget
    (``fast_core.Budget``), or None for the run configuration's (``fast run --budget-samples``, else none).
    ``tensorboard``: a folder where this rank writes its records as TensorBoard scalars too
    (``fast_core.observers.tensorboard``; the ``tensorboard`` extra), or None for the run configuration's (``fast run
    --tensorboard``).
    ``broadcast_start``: rank 0's parameters are every rank's start (the default); False keeps each rank's own,
    refused for strategies that need an equal start (``Strategy.needs_equal_start``: choco, diloco).
    """

    def __init__(
        self,
        model: ModelAdapter,
        strategy: Strategy | str | None,
        engine: Engine,
        *,
        broadcast_start: bool = True,
        log_every: int | None = None,
        observers: Sequence[Observer] | None = None,
        config: RunConfig | None = None,
        budget: Budget | None = None,
        tensorboard: str | os.PathLike[str] | None = None,
    ) -> None:
        parts = wire(model, strategy, engine, config, observers=observers, budget=budget, tensorboard=tensorboard)
        self.model, self.engine, self.strategy = model, engine, parts.strategy
        self.metrics, self.context = parts.metrics, parts.context
        self.group, self.claims = parts.group, parts.claims
        self.observers, self.records = parts.observers, parts.records
        self.log_every = log_every
        self.uneven_inputs = False
        """Set while ranks may run out of data at different steps: lockstep strategies then count the ranks
        still training at every step, and a rank out of data calls join()."""
        self.started_at: float | None = None
        """``time.monotonic()`` at the end of the collective ``start``: the common origin of wall-clock points
        (snapshots, "consensus" records), the same moment on every rank up to a message latency."""
        self._clock = parts.clock
        self._profile = parts.profile
        self.time_split: TimeSplit | None = None
        """Where this rank's time goes, phase by phase, from ``start`` on (``fast run --profile``; else None)."""
        self._broadcast_start = broadcast_start
        self._started = False
        self._closed = False

    @property
    def step(self) -> int:
        """Optimizer steps taken so far (the same on every rank under lockstep strategies)."""
        return self.context.step

    @step.setter
    def step(self, value: int) -> None:  # a checkpoint restores it
        set_step(self.context, value)

    @property
    def running(self) -> bool:
        """Started and not closed yet: its steps run the strategy."""
        return self._started and not self._closed

    # training ---------------------------------------------------------------------------------------------------
    def start(self) -> Worker:
        """Check every rank holds the same model and runs the same strategy (one collective), give all the same
        start, and let the strategy set up. A replacement of lost ranks (a process ``FaultTolerant.grow`` started)
        joins the running group instead, taking its parameters, step, optimizer state and budget."""
        if self._started:
            return self
        if self._profile:
            self.time_split = TimeSplit()  # in its "start" phase
        budgeted = self.claims.budget is not None
        if joining(self.engine):
            self.claims.open(self.strategy.lockstep_steps() if budgeted else 0, joining=True)
            self.group.join()
        else:
            self.group.start(lambda: self._start_together(budgeted))  # a rank lost meanwhile is left behind
            self.group.state.first_step = self.step
        started = self.claims.started_at
        self.started_at = started if started is not None else time.monotonic()
        self._started = True
        self._enter("compute")
        self._clock.restart()
        self.observers.announce(self._started_event())  # also when none listens yet: one attached later hears it
        self.group.started()
        return self

    def _start_together(self, budgeted: bool) -> None:
        """The collective part of ``start`` on a new job (all of it runs again over the survivors of a loss)."""
        check_same_setup(self.model.layout, canonical_strategy(self.strategy, shared=True), self.engine)
        lockstep_steps = self.strategy.lockstep_steps() if budgeted else 0  # may refuse, on every rank
        if self._broadcast_start:
            collectives.broadcast_params(self.model, self.engine, root=0)
        elif self.strategy.needs_equal_start:  # the same on every rank: every rank refuses
            raise ConfigError(
                f"{canonical_strategy(self.strategy)} needs every replica to start from the same parameters "
                "(its state starts from this worker's own, so replicas that start apart would never meet): leave "
                "broadcast_start at its default, True"
            )
        self.strategy.setup(self.context)
        self.claims.open(lockstep_steps)  # collective under a budget, like the rest of start

    def _started_event(self) -> Started:
        budget = self.claims.budget
        return Started(
            self.step,
            self.engine.size,
            strategy=repr(self.strategy),
            strategy_name=self.strategy.name,
            started_at=self.started_at,
            metrics=self.metrics,
            budget_samples=budget.samples if budget else None,
            budget_seconds=budget.seconds if budget else None,
        )

    def before_step(self) -> None:
        """Hook between backward and the optimizer step (gradient strategies act here)."""
        self._ensure_started()
        if len(self.observers):  # no record made when none listens: a step pays nothing for observers
            elapsed = self._clock.elapsed()
            self._enter("measurement")
            self.observers.announce(ComputeEnded(self.step, elapsed))
        self._enter("exchange")
        if self.uneven_inputs and self.strategy.lockstep:
            collectives.count_active(self.engine, True)
        if not self.group.changing:
            self.group.in_step(lambda: self.strategy.before_step(self.context))
        self._enter("update")

    def after_step(self) -> None:
        """Hook after the optimizer step (parameter strategies act here)."""
        self._ensure_started()
        self._enter("exchange")
        if not self.group.changing:
            self.group.in_step(self._mix)
        self.step = self.group.end_step(self.step + 1)  # after a lost rank: the group's consensus point
        if self.log_every and self.step % self.log_every == 0:
            data = self.metrics.as_dict()
            log.info("rank %d %s", self.engine.rank, " ".join(f"{k}={_short(v)}" for k, v in data.items()))
        if len(self.observers):
            self._enter("measurement")
            self.observers.announce(StepEnded(self.step))
        self._enter("compute")
        self._clock.restart()

    def _mix(self) -> None:
        self.group.admit_joiners()  # rank 0, when workers asked to join: the check below then meets the change
        self.engine.check_alive()  # stop (or survive) at once when another worker was lost, whatever the strategy
        self.strategy.after_step(self.context)

    def run_step(self, update: Callable[[], object] | None = None) -> None:
        """One step for adapters that run the update themselves (fast_tf, fast_jax; fast_torch gets this order from
        its optimizer's step hooks): the gradient hook (all-reduce averages the gradient the adapter loaded into the
        model, FAST sends it), ``update()`` (the user's optimizer with that gradient as the strategy left it, or the
        user's whole step; None when the framework has already applied its update), then the parameter hook
        (gossip mixes, FAST applies the neighbours' gradients)."""
        self.before_step()
        if update is not None:
            update()
        self.after_step()

    def claim_batch(self, batch_size: int) -> int:
        """Call before each batch: how many samples to train in it (``batch_size``; fewer on the job's last grant
        under a sample budget, then train that many of the batch), or 0 when the budget is spent (stop training
        and call ``close()``). Without a budget it always returns ``batch_size``. A claim holds until the step is
        taken: asked again before ``after_step``, it returns the same number. Counted in ``metrics.samples``."""
        self._ensure_started()
        with nullcontext() if self.time_split is None else self.time_split.during("budget"):
            return self.claims.batch(check_batch_size(batch_size))

    def join(self) -> int:
        """Called by a rank out of data: take part in the steps of the others, with a zero gradient, until every
        rank is out of data, so lockstep strategies never hang on uneven inputs. Returns the steps shadowed.

        Requires ``uneven_inputs = True`` on every rank while training (adapters' join helpers set it).
        """
        if not self.strategy.lockstep:
            return 0
        if not self.uneven_inputs:
            raise RuntimeError("join() needs uneven_inputs=True on every rank during training (use the adapter's join)")
        shadowed = 0
        while collectives.count_active(self.engine, False):
            grads = self.model.grads()
            grads.fill(0.0)
            self.model.set_grads(grads)
            self.strategy.before_step(self.context)
            self.model.apply_gradient(self.model.grads())  # all-reduce ranks stay identical: same mean gradient
            self.after_step()
            shadowed += 1
        return shadowed

    def end_epoch(self, metric: float) -> None:
        """Tell the strategy an epoch ended, with this rank's validation metric (higher is better)."""
        self._ensure_started()
        self._enter("exchange")
        self.group.collective(lambda: self.strategy.end_epoch(self.context, metric))
        self._enter("measurement")
        self.observers.announce(EpochEnded(self.step))
        self._enter("compute")
        self._clock.restart()  # the epoch's evaluation is not a step's compute

    def resume(self, step: int, samples_before: int = 0) -> None:
        """A checkpoint replaced the parameters (collective; ``fast_core.runtime.checkpoint.load`` calls it):
        continue at ``step``, let the strategy forget what it sent from the old parameters (``Strategy.reset``), and
        under a sample budget train only what the job had left after its ``samples_before``."""
        self._ensure_started()
        self.step = step
        self.claims.resume(samples_before)
        self.strategy.reset(self.context)

    def close(self) -> None:
        """Finish pending communication; call once at the end of training on every rank (collective).

        Asynchronous strategies stop their communication threads once every rank's last messages have landed, so
        nothing is in flight afterwards; messages that landed unread are dropped (they hold older values of
        models the ranks still have). The consensus model is the ranks' average after this: the adapters' end
        (``fast_torch.average_model``, ``fast_tf.Callback(average_at_end=True)``, ``fast_jax.average(step=)``)
        closes, then averages."""
        if self._started and not self._closed:
            self._enter("exchange")
            self.group.collective(self._close_all)
            self._closed = True
            split = None if self.time_split is None else self.time_split.summary()
            self.observers.announce(Closed(self.step, split))
            log.debug("rank %d closed after %d steps", self.engine.rank, self.step)

    def _close_all(self) -> None:
        self.strategy.close(self.context)
        self.claims.close()  # collective under a budget: the grant service stops, the job's samples are summed

    # ---------------------------------------------------------------------------------------------------------------
    def _enter(self, phase: str) -> None:
        if self.time_split is not None:
            self.time_split.enter(phase)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()
        if self._closed:
            raise RuntimeError("this FAST worker was closed; create a new one to train again")


def _short(value: float | int | None) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
