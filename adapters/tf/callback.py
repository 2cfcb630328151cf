"""fast_tf.Callback: any fast_core strategy inside ``model.fit``, with Keras 3 APIs only (every Keras backend).

When the hooks run. The strategy's step hooks for batch k run at the start of batch k + 1
(``on_train_batch_begin``), and for the last batch of an epoch before validation (``on_test_begin``) or at
``on_epoch_end``. Keras runs ``on_train_batch_begin`` synchronously, and a callback that overrides
``on_train_batch_end`` turns off Keras' asynchronous batch dispatch for every callback of the fit (see
``keras/src/callbacks/callback_list.py``); this one never overrides it, so the progress bar and other callbacks keep
it. The model is reached through the reference ``set_model`` gave, not ``Callback.model`` (which syncs the JAX
trainer's state on every access): a step where the strategy does nothing (``every=k``) touches no variable. Under
a work budget each batch is claimed one batch ahead, at the start of the batch before (``fast_tf.budget``).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import keras
import numpy as np

from fast_core import Budget, ConfigError, Engine, Strategy, Worker
from fast_core.config.current import run_config
from fast_core.engine.collectives import average_logs, min_max
from fast_core.interop.elastic import track
from fast_core.interop.horovod import compressed_strategy
from fast_core.runtime.process import init
from fast_core.strategies.spec import resolve_strategy

from .budget import Grants, check_budget_options
from .checkpoint import load_into
from .model import KerasModel
from .optimizer import DistributedOptimizer
from .variables import average_variables, broadcast_variables, floating


class Callback(keras.callbacks.Callback):
    """Train with ``strategy`` across the job's ranks: ``model.fit(..., callbacks=[fast_tf.Callback("async:torus")])``.

    At the start every rank checks it holds the same model and takes rank 0's weights (and floating non-trainable
    variables, e.g. BatchNorm statistics). After each batch (or every ``every`` batches) the strategy runs; gradient
    strategies (all-reduce, FAST) need the model compiled with ``fast_tf.DistributedOptimizer``; parameter
    strategies accept it too (each stored gradient is applied with the wrapped optimizer before the strategy mixes:
    the plain optimizer's numbers, one host copy more a step), so one script compiled with it serves every
    strategy. At each epoch end ``logs`` become the mean over ranks, so rank 0's progress bar shows the job's loss,
    plus ``consensus_distance``. Both are collectives, so by default (None) only synchronous strategies pay them:
    under an asynchronous one they would hold every rank to the slowest one's pace once an epoch, and each rank logs
    its own numbers instead. ``monitor`` (this rank's own value; names containing "loss" are negated) picks FAST's best
    replica. At the end the worker closes and, with ``average_at_end``, every rank holds the averaged model.

    Under ``fast run`` each epoch's logs go to the run's records (``val_accuracy`` is what ``fast bench`` times
    to its target); Keras does not tell callbacks the batch size, so pass ``batch_size`` for samples/s there.

    ``budget``: a shared work budget (``fast_core.Budget``), or None for the run configuration's (``fast run
    --budget-samples/--budget-seconds``, else none). Under one, ``fit(..., epochs=<enough>)`` trains until the
    job's budget is spent: every batch is claimed (``batch_size`` is then required, and every batch fit trains
    must hold that many samples: ``fast_tf.Batches`` feeds full batches, reshuffled at each pass, endlessly),
    under an asynchronous strategy a faster rank trains more batches, and every rank's fit stops once the budget
    is spent; a synchronous strategy keeps every rank on the same steps. Grants are whole batches (a sample
    budget is rounded down to a multiple of ``batch_size`` under an asynchronous strategy; see
    ``fast_tf.budget``). Epoch-end collectives (averaged logs, consensus distance, FAST's restart) then run only
    after the epochs every rank is sure to finish (``Claims.collective_passes``; every epoch if synchronous).

    ``resume_from``: a checkpoint of ``fast_tf.save_checkpoint`` (saved on any number of ranks) that the first fit
    starts from: the consensus model, the optimizer's variables, BatchNorm statistics, FAST's step and the budget
    the job had left. The model must be compiled with the optimizer class it was saved with.

    ``tensorboard``: a folder where this rank writes the records this callback makes (samples, the
    worker's counters; the epochs' logs) as TensorBoard scalars while it trains, or None for ``fast run
    --tensorboard``'s (the ``tensorboard`` extra; keras.callbacks.TensorBoard writes Keras' own logs beside them).

    Place it first in ``callbacks`` so the others (EarlyStopping, checkpoints) see the averaged logs and take the
    same decision on every rank. ``worker`` is the fast_core Worker of the current fit (metrics, consensus).
    """

    def __init__(
        self,
        strategy: Strategy | str | None = None,
        *,
        every: int | None = None,
        engine: Engine | None = None,
        average_metrics: bool | None = None,
        consensus: bool | None = None,
        average_at_end: bool = True,
        monitor: str = "val_accuracy",
        log_every: int | None = None,
        batch_size: int | None = None,
        budget: Budget | None = None,
        resume_from: str | os.PathLike | None = None,
        tensorboard: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        if budget is not None and not isinstance(budget, Budget):
            raise ConfigError(f"budget={budget!r}: give a fast_core.Budget, e.g. Budget(samples=20000), or None")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1
        ):
            raise ConfigError(f"batch_size={batch_size!r}: give the samples of each batch fit trains, >= 1")
        self.strategy = strategy
        self.every = every
        self.engine = engine
        self.average_metrics = average_metrics
        self.consensus = consensus
        self.average_at_end = average_at_end
        self.monitor = monitor
        self.log_every = log_every
        self.batch_size = batch_size
        self.budget = budget
        self.resume_from = resume_from
        self.tensorboard = tensorboard
        self.worker: Worker | None = None
        self.adapter: KerasModel | None = None
        self._fit_model: keras.Model | None = None
        self._pending = False  # a batch began whose step hooks have not run yet
        self._deferred = False  # the model is built by fit's first step: the start waits for its end
        self._applies_gradients = False  # the compiled step stores gradients; this callback applies them
        self._grants: Grants | None = None  # this fit's claims under a work budget
        self._epochs = 0  # epochs ended in this fit
        self._collective_epochs: int | None = None  # epochs after which every rank takes part (None: all)

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        self._fit_model = model

    # training begins and ends ---------------------------------------------------------------------------------
    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        self._deferred = not self.model.built and not self.model.trainable_variables
        if not self._deferred:
            self._start()
            return
        # no keras.Input (Horovod's usual model): Keras builds the model inside the first step, so the start waits
        # for that step's end; a DistributedOptimizer stores the first gradient meanwhile, applied after the start
        if self.budget is not None or Budget.from_config(run_config()) is not None:
            raise ConfigError(
                "a work budget counts every batch from the first: build the model before fit (give it a "
                "keras.Input, or call it on a batch)"
            )
        if isinstance(self.model.optimizer, DistributedOptimizer):
            self.model.optimizer.attached = True

    def _start_deferred(self) -> None:
        """Once fit's first step has built a model with no Input: start, and let the strategy run for that step
        (never in ``on_train_batch_end``: overriding it stops Keras dispatching batch ends asynchronously)."""
        if self._deferred and self.model.trainable_variables:
            self._deferred = False
            self._start()
            self._pending = True

    def _start(self) -> None:
        """The worker of this fit over the built model: the strategy, the start from rank 0's weights, a resumed
        checkpoint, the budget's first claim."""
        model = self.model  # on JAX this attaches the trainer's state once; later steps use _fit_model
        engine = self.engine or init()
        self.adapter = adapter = KerasModel(model)
        chosen = self.strategy
        compression = getattr(model.optimizer, "compression", None)  # a Horovod DistributedOptimizer's
        if compression is not None:
            chosen = compressed_strategy(compression, chosen, engine)
        strategy = resolve_strategy(chosen, every=self.every)  # a string gives each fit a fresh strategy
        worker = Worker(
            adapter, strategy, engine, log_every=self.log_every, budget=self.budget, tensorboard=self.tensorboard
        )
        self.worker = worker
        track(worker)  # Horovod's elastic run, if one is in progress, recovers through this fit's worker
        steps = self._check_steps(worker)
        self._configure_gradients(model, adapter, worker.strategy)
        self._grants, self._collective_epochs = None, None
        if worker.claims.budget is not None:  # the budget of the run configuration, when none was given
            batch_size = check_budget_options(worker, self.batch_size, getattr(model, "steps_per_execution", 1))
            self._grants = Grants(worker, batch_size, model, adapter)
        worker.start()  # same model on every rank (fingerprint), rank 0's weights
        broadcast_variables(floating(model.non_trainable_variables), engine)
        if self.resume_from is not None:
            load_into(self.resume_from, self)  # the model, optimizer, step and budget left of the checkpoint
            self.resume_from = None  # a later fit goes on from where this one ends
        if self._grants is not None:  # the epochs every rank finishes in what is left of the budget
            job_pass = steps * batch_size * worker.engine.size
            self._collective_epochs = worker.claims.collective_passes(job_pass, batch_size)
        self._pending = False
        self._epochs = 0
        if self._grants is not None:
            self._grants.start()  # claims the first batch
        self._started()

    def _started(self) -> None:
        """What a subclass adds to the start (Horovod's callback: a root other than 0)."""

    def on_train_end(self, logs: MutableMapping | None = None) -> None:
        self._start_deferred()
        if self._deferred:  # no step ran: nothing was started
            return
        self._finish_step()
        if self._grants is not None:
            self._grants.end()
        worker, adapter = self.worker, self.adapter
        worker.close()
        if self.average_at_end:
            adapter.set_params(worker.group.average_params())
            adapter.sync()
            average_variables(floating(self._fit_model.non_trainable_variables), worker.engine)
        optimizer = self._fit_model.optimizer
        if isinstance(optimizer, DistributedOptimizer):
            optimizer.attached = False  # a later step traced without this callback raises instead of not training

    # steps ------------------------------------------------------------------------------------------------------
    def on_train_batch_begin(self, batch: int, logs: MutableMapping | None = None) -> None:
        self._start_deferred()
        self._finish_step()
        self._pending = self._grants is None or self._grants.begin_batch()  # claims the next batch

    def on_test_begin(self, logs: MutableMapping | None = None) -> None:
        self._start_deferred()
        self._finish_step()  # validation inside fit sees the model after the epoch's last step and mixing

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        self._start_deferred()
        self._finish_step()
        logs = {} if logs is None else logs
        worker = self.worker
        lockstep = worker.strategy.lockstep
        collective = self._collective_epochs is None or self._epochs < self._collective_epochs
        self._epochs += 1
        consensus = collective and (lockstep if self.consensus is None else self.consensus)
        distance = worker.group.consensus_distance() if consensus else None  # before FAST's restart zeroes it
        if collective:
            worker.end_epoch(self._monitored(logs))
        if collective and (lockstep if self.average_metrics is None else self.average_metrics):
            average_logs(logs, worker.engine)
        if distance is not None:
            logs["consensus_distance"] = distance
        if worker.records.wanted:  # `fast run`'s records: this epoch's (averaged, if asked) logs
            worker.records.epoch(**{key: float(value) for key, value in logs.items() if _is_number(value)})

    def _finish_step(self) -> None:
        """Run the strategy for the batch that last began; a no-op when none is pending."""
        if not self._pending:
            return
        self._pending = False
        self.adapter.new_step()
        if self._applies_gradients:  # the compiled step stored its gradient: the strategy sees it, then it is applied
            self.adapter.load_gradients()
            self.worker.run_step(self.adapter.apply_own_gradient)
        else:  # the compiled step applied its update
            self.worker.run_step()
        if self.batch_size is not None:
            self.worker.records.step(samples=self.batch_size)  # free unless under `fast run`

    def _monitored(self, logs: MutableMapping) -> float:
        name = self.monitor if self.monitor in logs else "loss"
        value = float(logs.get(name, 0.0))
        return -value if "loss" in name else value

    # checks -------------------------------------------------------------------------------------------------------
    def _check_steps(self, worker: Worker) -> int:
        """The most steps per epoch of any rank (collective)."""
        steps = (self.params or {}).get("steps")
        if steps is None:
            raise ValueError(
                "fast_tf.Callback needs the number of steps per epoch, and Keras does not know it for this data: "
                "pass steps_per_epoch to fit, or give arrays or a dataset of known length (fast_tf.shard)"
            )
        low, high = min_max(worker.engine, steps)
        if low != high and worker.strategy.lockstep:
            raise ValueError(
                f"ranks run between {low} and {high} steps per epoch (rank {worker.engine.rank}: {steps}); the "
                f"synchronous strategy {worker.strategy.name!r} needs the same number on every rank: split the data "
                "with fast_tf.shard(..., drop_last=True) or pass the same steps_per_epoch to fit everywhere"
            )
        return high

    def _configure_gradients(self, model: keras.Model, adapter: KerasModel, strategy: Strategy) -> None:
        optimizer = model.optimizer
        self._applies_gradients = isinstance(optimizer, DistributedOptimizer)
        if not self._applies_gradients:
            if strategy.uses_gradients:
                raise ConfigError(
                    f"strategy {strategy.name!r} exchanges gradients, which model.fit keeps inside its compiled "
                    "step: compile with optimizer=fast_tf.DistributedOptimizer(your_optimizer), which hands each "
                    "step's gradient to this callback, or choose a parameter strategy such as 'dpsgd:ring' or "
                    "'async:torus'"
                )
            adapter.optimizer = optimizer
            return
        if getattr(model, "steps_per_execution", 1) != 1:
            raise ConfigError(
                f"fast_tf.DistributedOptimizer needs steps_per_execution=1 (got {model.steps_per_execution}): each "
                "step's gradient must reach the callback before the next step; compile with steps_per_execution=1"
            )
        if not optimizer.built:
            optimizer.build(adapter.variables)
        if [tuple(g.shape) for g in optimizer.gradients] != [tuple(v.shape) for v in adapter.variables]:
            raise ConfigError(
                "this fast_tf.DistributedOptimizer was built for other variables than the model's trainable ones; "
                "compile the model again with a new DistributedOptimizer after changing what is trainable"
            )
        adapter.optimizer = optimizer.optimizer
        adapter.gradient_store = optimizer.gradients
        optimizer.attached = True  # a parameter strategy too: _finish_step applies each gradient, then mixes


def _is_number(value: object) -> bool:
    """A log value that is one number (Keras logs Python floats, NumPy or backend scalars)."""
    try:
        return bool(np.ndim(value) == 0 and np.isfinite(float(value)))
    except (TypeError, ValueError):
        return False
