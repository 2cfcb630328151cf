"""A Worker ties one model (through the adapter contract) to a resolved strategy, an engine and its observers.

Adapters call ``before_step`` between backward and the optimizer step and ``after_step`` after it; the strategy
decides what to exchange through a narrow ``StepContext`` (it never sees the Worker). The Worker owns the step
clock, the metrics (counted by a metering engine, not by hand), the start-up checks, the join protocol, and tells
its observers (reporter, straggler) what happens. It reads no environment variable: the run configuration
(``fast_core.config.run``) is resolved before it is built.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from fast_core.config.current import run_config
from fast_core.config.run import RunConfig
from fast_core.engine import Engine, collectives
from fast_core.engine.capabilities import joining
from fast_core.engine.metered import MeteredEngine
from fast_core.errors import PeerLost
from fast_core.metrics import Metrics
from fast_core.model.contract import ModelAdapter
from fast_core.observers.base import Observer
from fast_core.observers.reporting import Reporter
from fast_core.observers.straggler import Straggler
from fast_core.runtime.agreement import check_same_setup
from fast_core.runtime.budget import Allowance, Budget, check_batch_size
from fast_core.runtime.survival import Recovery, check_can_survive, join, resync, survive
from fast_core.strategies import Strategy
from fast_core.strategies.base import GroupChange, StepContext
from fast_core.strategies.canonical import canonical_strategy
from fast_core.strategies.spec import resolve_strategy

log = logging.getLogger("fast")
T = TypeVar("T")


class Worker:
    """One rank's training state: model adapter, strategy, engine, step counter, metrics and observers.

    ``strategy``: a Strategy, a strategy string, or None for the run configuration's (``fast run --strategy``,
    else all-reduce). ``observers``: None takes those the run configuration asks for (a reporter and a straggler
    under ``fast run``); pass a list (maybe empty) to choose. ``budget``: a shared work budget
    (``fast_core.Budget``), or None for the run configuration's (``fast run --budget-samples``, else none).
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
    ) -> None:
        config = config if config is not None else run_config()
        self.model = model
        self.engine = engine
        self.strategy = resolve_strategy(strategy, config)
        self.rank = engine.rank
        self.size = engine.size
        self.metrics = Metrics()
        self.context = StepContext(MeteredEngine(engine, self.metrics), model, self.metrics)
        self.log_every = log_every
        self.uneven_inputs = False
        """Set while ranks may run out of data at different steps: lockstep strategies then count the ranks
        still training at every step, and a rank out of data calls join()."""
        self.observers = list(observers) if observers is not None else observers_for(config, self.rank, self.size)
        self._broadcast_start = broadcast_start
        self._started = False
        self._closed = False
        self.started_at: float | None = None
        """``time.monotonic()`` at the end of the collective ``start``: the common origin of wall-clock points
        (snapshots, "consensus" records), the same moment on every rank up to a message latency."""
        # the shared work budget (fast_core.runtime.budget): nothing to pay without one
        self.budget = budget if budget is not None else Budget.from_config(config)
        self.allowance: Allowance | None = None
        self._claim: tuple[int, int] | None = None  # (step, samples) of the last claim_batch
        self.samples_before = 0
        """Samples the job trained before a checkpoint this worker resumed from (``resume``)."""
        self.step_compute = 0.0
        """Seconds of this step's compute: from the last step's end (or an epoch's end, or the start) to its gradient
        hook, so forward, backward and data loading. Measured once here, before ``on_compute_end``, for every
        observer (the Reporter sums it, the relative Straggler stretches it)."""
        self._compute_from = time.perf_counter()
        self.first_step = 0
        """The step training started (or resumed) from: a strategy's lockstep steps count from it."""
        self.recoveries: list[Recovery] = []
        self._change: GroupChange | None = None  # a loss survived, its consensus point still to come
        self._detected = 0.0
        """The losses of ranks this worker survived (a fault-tolerant engine), in order
        (``fast_core.runtime.survival``)."""

    @property
    def layout(self):
        return self.model.layout

    @property
    def step(self) -> int:
        """Optimizer steps taken so far (the same on every rank under lockstep strategies)."""
        return self.context.step

    @step.setter
    def step(self, value: int) -> None:  # a checkpoint restores it
        self.context.step = self.context.round = int(value)
        self.metrics.steps = int(value)

    @property
    def reporting(self) -> bool:
        """True when an observer wants the ``record*`` values (under `fast run`): scripts check it before
        computing a per-step number only the records need."""
        return any(observer.records for observer in self.observers)

    # training ---------------------------------------------------------------------------------------------------
    def start(self) -> Worker:
        """Check every rank holds the same model and runs the same strategy (one collective), give all the same
        start, and let the strategy set up."""
        if self._started:
            return self
        if joining(self.engine):
            return self._join()
        check_same_setup(self.layout, canonical_strategy(self.strategy, shared=True), self.engine)
        lockstep_steps = self.strategy.lockstep_steps() if self.budget is not None else 0  # may refuse, on every rank
        if self._broadcast_start:
            collectives.broadcast_params(self.model, self.engine, root=0)
        self.strategy.setup(self.context)
        if self.budget is not None:  # collective, like the rest of start
            self.allowance = Allowance(self.budget, self.context.engine, lockstep_steps, first_step=self.step).start()
        self.first_step = self.step
        self.started_at = self.allowance.started if self.allowance is not None else time.monotonic()
        self._started = True
        self._compute_from = time.perf_counter()
        self._notify("on_start")
        return self

    def _join(self) -> Worker:
        """Start as a replacement of lost ranks (a process ``Engine.grow`` started): join the running group, taking
        its parameters, step, optimizer state and budget (``fast_core.runtime.survival.join``) instead of the
        start-up."""
        if self.budget is not None:
            lockstep_steps = self.strategy.lockstep_steps()
            self.allowance = Allowance(self.budget, self.context.engine, lockstep_steps)
        join(self)
        if self.allowance is not None:
            self.allowance.first_step = self.first_step
        self.started_at = self.allowance.started if self.allowance is not None else time.monotonic()
        self._started = True
        self._compute_from = time.perf_counter()
        self._notify("on_start")
        return self

    def before_step(self) -> None:
        """Hook between backward and the optimizer step (gradient strategies act here)."""
        self._ensure_started()
        self.step_compute = time.perf_counter() - self._compute_from
        self._notify("on_compute_end")
        if self.uneven_inputs and self.strategy.lockstep:
            collectives.count_active(self.engine, True)
        if self._change is None:
            self._in_step(lambda: self.strategy.before_step(self.context))

    def after_step(self) -> None:
        """Hook after the optimizer step (parameter strategies act here)."""
        self._ensure_started()
        if self._change is None:
            self._in_step(self._mix)
        if self._change is not None:  # a rank was lost in this step: the step ends at the consensus point
            self.step = self._recover(self.step + 1)
        else:
            self.step = self.step + 1
        if self.log_every and self.step % self.log_every == 0:
            data = self.metrics.as_dict()
            log.info("rank %d %s", self.rank, " ".join(f"{k}={_short(v)}" for k, v in data.items()))
        self._compute_from = time.perf_counter()
        self._notify("on_step_end")

    def _mix(self) -> None:
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
        self.run_collective(lambda: self.strategy.end_epoch(self.context, metric))
        self._compute_from = time.perf_counter()  # the epoch's evaluation is not a step's compute
        self._notify("on_epoch_end")

    def close(self) -> None:
        """Finish pending communication; call once at the end of training on every rank (collective).

        Asynchronous strategies stop their communication threads once every rank's last messages have landed, so
        nothing is in flight afterwards; messages that landed unread are dropped (they hold older values of
        models the ranks still have). The consensus model is the ranks' average after this: the adapters' end
        (``fast_torch.average_model``, ``fast_tf.Callback(average_at_end=True)``, ``fast_jax.average(step=)``)
        closes, then averages."""
        if self._started and not self._closed:
            self.run_collective(self._close_all)
            self._closed = True
            self._notify("on_close")
            log.debug("rank %d closed after %d steps", self.rank, self.step)

    def _close_all(self) -> None:
        self.strategy.close(self.context)
        if self.allowance is not None:  # collective: the grant service stops, the job's samples are summed
            self.metrics.job_samples = self.allowance.close(self.metrics.samples)

    def resume(self, step: int, samples_before: int = 0) -> None:
        """A checkpoint replaced the parameters (collective; ``fast_core.runtime.checkpoint.load`` calls it):
        continue at ``step``, let the strategy forget what it sent from the old parameters (``Strategy.reset``), and
        under a sample budget train only what the job had left after its ``samples_before``."""
        self._ensure_started()
        self.step = step
        self.samples_before = int(samples_before)
        self._claim = None
        if self.allowance is not None:
            self.allowance.resume(self.samples_before)
            self.engine.barrier()  # rank 0's counter holds what is left before any rank claims from it
        self.strategy.reset(self.context)

    # the shared work budget ---------------------------------------------------------------------------------------
    def claim_batch(self, batch_size: int) -> int:
        """Call before each batch: how many samples to train in it (``batch_size``; fewer on the job's last grant
        under a sample budget, then train that many of the batch), or 0 when the budget is spent (stop training
        and call ``close()``). Without a budget it always returns ``batch_size``. A claim holds until the step is
        taken: asked again before ``after_step``, it returns the same number. Counted in ``metrics.samples``."""
        self._ensure_started()
        batch_size = check_batch_size(batch_size)
        if self._claim is not None and self._claim[0] == self.step:
            return self._claim[1]
        allowance = self.allowance
        granted = self.run_collective(lambda: allowance.claim(batch_size, self.step)) if allowance else batch_size
        self.metrics.samples += granted
        self._claim = (self.step, granted)
        return granted

    def collective_passes(self, job_pass: int, batch_size: int) -> int | None:
        """Under a budget, after how many of its passes over its shard this rank may still call an epoch-end
        collective (``end_epoch``: FAST's restart) knowing every rank calls it too. ``job_pass``: the samples one
        pass of every rank trains (a global epoch). None: after every pass (a lockstep strategy: all ranks run the
        same steps, or no budget). Asynchronous: the passes every rank finishes before the budget is spent (for a
        resumed job, what it had left), whatever the ranks' speeds; while a rank waits after pass k, the job has
        trained at most k global epochs plus the batches the ranks reserved (two per rank and ``ahead``), so
        k <= (samples - that) / job_pass; 0 when the budget has seconds (the ranks' passes when time is up are
        unknown)."""
        if self.budget is None or math.isinf(self.strategy.lockstep_steps()):
            return None
        if self.budget.samples is None or self.budget.seconds is not None:
            return 0
        reserved = 2 * self.budget.most_ahead * self.size * batch_size
        return max(0, (self.budget.samples - self.samples_before - reserved) // job_pass)

    # the consensus model ------------------------------------------------------------------------------------------
    def average_params(self) -> np.ndarray:
        """The mean of all ranks' parameters (one allreduce), as a new buffer: the model is left as it is, so it
        also evaluates the consensus model mid-training. Collective: every rank must call it at the same point;
        under an asynchronous strategy that makes the ranks wait for each other (the slowest sets the pace there)."""
        return self.run_collective(lambda: collectives.average_params(self.model, self.engine))

    def consensus_distance(self) -> float:
        """(1/N) sum_i ||x_i - x_bar||^2, the spread decentralized methods keep small; every rank must call it."""
        value = self.run_collective(lambda: collectives.consensus_distance(self.model, self.engine))
        self.metrics.consensus_distance = value
        return value

    # what scripts tell the observers ---------------------------------------------------------------------------
    def record(self, **values: float) -> None:
        """This step's numbers for the run log and progress bar under `fast run`, e.g. ``record(loss=0.3,
        samples=32)``: averaged between records (``samples`` adds up). Free when not under `fast run`."""
        self._notify("on_record", "step", values)

    def record_epoch(self, **values: float) -> None:
        """One "epoch" record now, e.g. ``record_epoch(val_accuracy=0.93, loss=0.2)``, with the metrics and the
        last consensus distance computed (epochs are counted unless ``epoch=`` is given)."""
        self._compute_from = time.perf_counter()  # the epoch's evaluation is not a step's compute
        self._notify("on_record", "epoch", values)

    def record_consensus(self, **values: float) -> None:
        """One "consensus" record: a value of the consensus (averaged) model at a wall-clock point, e.g.
        ``record_consensus(time=12.5, val_accuracy=0.91)`` with ``time`` in seconds since the common start
        (``fast_core.observers.snapshots`` computes them after training; rank 0 records them, also after
        ``close()``)."""
        self._notify("on_record", "consensus", values)

    def record_result(self, **values: float) -> None:
        """Final numbers of the run, e.g. ``record_result(test_accuracy=0.95)``, also after ``close()``."""
        self._notify("on_record", "result", values)

    # ---------------------------------------------------------------------------------------------------------------
    def run_collective(self, action: Callable[[], T]) -> T:
        """Run ``action``, communication every rank of the job takes part in (a hook's, or the script's own
        averages); when the engine reports a lost rank and the job can go on (a fault-tolerant engine), survive it
        (``fast_core.runtime.survival``) and run ``action`` again over the group after. ``action`` must leave its
        inputs as they were when it fails (the engines' collectives do)."""
        for attempt in itertools.count():
            try:
                return action()
            except PeerLost as error:
                self._lost(error, attempt)
                self.step = self._recover(self.step)
        raise AssertionError("unreachable")

    def _in_step(self, hook: Callable[[], None]) -> None:
        """A strategy's hook: a rank lost in it is survived, and the rest of the step exchanges nothing (it ends at
        the consensus point, in ``after_step``)."""
        try:
            hook()
        except PeerLost as error:
            self._lost(error, 0)

    def _lost(self, error: PeerLost, attempt: int) -> None:
        check_can_survive(self, error, attempt)
        if self._change is None:
            self._detected = time.time()
        change = survive(self, error)
        self._change = change if self._change is None else self._change.then(change)

    def _recover(self, next_step: int) -> int:
        """The consensus point after a loss (collective): the step to run next; losses meanwhile are survived."""
        for attempt in itertools.count(1):
            try:
                step = resync(self, self._change, member=True, next_step=next_step)
                break
            except PeerLost as error:
                self._lost(error, attempt)
        recovery = Recovery(self._change.lost, self._change.replaced, step, self.size, self._detected, time.time())
        self._change = None
        self.recoveries.append(recovery)
        self._notify("on_record", "membership", recovery.as_record())
        if self.rank == 0:
            replaced = f"replaced {list(recovery.replaced)}, " if recovery.replaced else ""
            log.warning(
                "lost rank(s) %s; %s%d rank(s) go on from step %d (recovered in %.2f s)",
                list(recovery.lost),
                replaced,
                self.size,
                step,
                recovery.recovered_at - recovery.detected_at,
            )
        return step

    def _notify(self, event: str, *args: object) -> None:
        for observer in self.observers:
            getattr(observer, event)(self, *args)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()
        if self._closed:
            raise RuntimeError("this FAST worker was closed; create a new one to train again")


def observers_for(config: RunConfig, rank: int, size: int) -> list[Observer]:
    """The observers ``config`` asks for on this rank (none when it asks for nothing: nothing to pay)."""
    observers: list[Observer] = []
    if config.reporting:
        observers.append(
            Reporter(rank, config.run_dir, config.log_every, config.progress, config.verbose, config.label)
        )
    straggler = Straggler.for_rank(config, rank, size)
    if straggler is not None:
        observers.append(straggler)
    return observers


def _short(value: float | int | None) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
