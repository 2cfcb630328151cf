"""fast_tf.Callback under a shared work budget (``fast_core.runtime.budget``): ``model.fit`` trains whole batches.

Keras checks ``model.stop_training`` only after a batch has trained (``on_train_batch_end``, see the fit loops of
``keras/src/backend/*/trainer.py``), and this callback never overrides that hook (it would turn off Keras'
asynchronous batch dispatch). So the claims run one batch ahead: at the start of batch k the callback claims batch
k + 1, and when nothing is granted it sets ``stop_training``, so Keras ends the fit after batch k. The first batch
is claimed at ``on_train_begin``; Keras trains one batch per fit whatever a callback says, so a rank that found
the budget already spent then (a budget of a few batches, or a seconds budget already over) has its model,
non-trainable and optimizer variables put back as they were at the start once the fit ends.

A grant is a whole batch or nothing: Keras cannot train part of a batch. Under a synchronous strategy every
grant is whole (every rank runs floor(samples / the job's samples per step) steps). Under an asynchronous one
rank 0's counter grants whole batches when every rank claims the same ``batch_size`` and the budget is a multiple
of it: the ranks' batch sizes are checked, and a budget that is not a multiple is rounded down (a warning says
so), so the samples the job trains equal the budget in force, ``worker.claims.budget``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import keras
import numpy as np

from fast_core import ConfigError, Worker
from fast_core.engine.collectives import min_max

from .model import KerasModel


def check_budget_options(worker: Worker, batch_size: int | None, steps_per_execution: int) -> int:
    """Before ``worker.start()``, when ``worker.claims.budget`` is set: the checks, the rounding, and the batch size.
    Collective under an asynchronous sample budget (the ranks' batch sizes are compared)."""
    if batch_size is None:
        raise ConfigError(
            f"fast_tf.Callback under the work budget {worker.claims.budget} needs batch_size=, the samples of every "
            "batch fit trains (Keras does not tell callbacks): e.g. Callback(..., batch_size=32) with "
            "fit(batch_size=32) or fast_tf.Batches(x, y, batch_size=32)"
        )
    if steps_per_execution != 1:
        raise ConfigError(
            f"fast_tf.Callback under a work budget needs steps_per_execution=1 (got {steps_per_execution}): every "
            "batch is claimed before it trains; compile with steps_per_execution=1"
        )
    budget = worker.claims.budget
    if budget.samples is None or worker.strategy.lockstep:
        return batch_size
    low, high = min_max(worker.engine, batch_size)
    if low != high:
        raise ConfigError(
            f"ranks train batches of {low} to {high} samples (rank {worker.engine.rank}: {batch_size}); under an "
            "asynchronous work budget fast_tf needs one batch size on every rank, so each grant is a whole batch: "
            "pass the same batch_size to fit and fast_tf.Callback everywhere"
        )
    whole = budget.samples - budget.samples % batch_size
    if whole == 0:
        raise ConfigError(
            f"Budget(samples={budget.samples}) is less than one batch of {batch_size} samples; fast_tf trains whole "
            f"batches: give at least {batch_size}, or smaller batches"
        )
    if whole != budget.samples:
        worker.claims.budget = dataclasses.replace(budget, samples=whole)
        if worker.engine.rank == 0:
            warnings.warn(
                f"fast_tf trains whole batches: the budget of {budget.samples} samples becomes {whole} "
                f"({whole // batch_size} batches of {batch_size})",
                stacklevel=4,
            )
    return batch_size


class Grants:
    """One fit's claims on the worker's budget, one batch ahead of Keras (module docstring).

    ``start`` after ``worker.start()``; ``begin_batch`` at each ``on_train_batch_begin`` tells whether that batch
    is granted (then its step hooks run and its samples count in ``worker.metrics.samples``); ``end`` at
    ``on_train_end``. Every claim goes through the worker's (``Claims.reserve`` ahead, ``Worker.claim_batch`` when
    the batch begins), so a rank lost meanwhile is survived. A grant reserved for a batch the fit never ran (its
    epochs ran out, or another callback stopped it) is neither trained nor counted."""

    def __init__(self, worker: Worker, batch_size: int, model: keras.Model, adapter: KerasModel) -> None:
        self.worker = worker
        self.batch_size = batch_size
        self.model = model
        self.adapter = adapter
        self.next = 0
        """The grant reserved for the next batch Keras runs (0: none, the fit stops after the current one)."""
        self._saved: list[tuple[keras.Variable, np.ndarray]] | None = None

    def start(self) -> None:
        self.next = self._reserve()
        if self.next == 0:  # Keras trains the first batch anyway: it is put back at the end
            self.model.stop_training = True
            self._saved = [(v, np.array(v.numpy(), copy=True)) for v in self._state()]

    def begin_batch(self) -> bool:
        if self.next == 0:
            return False
        self.worker.claim_batch(self.batch_size)  # takes the reserved grant and counts it
        self.next = self._reserve()
        if self.next == 0:
            self.model.stop_training = True  # Keras stops after this batch
        return True

    def end(self) -> None:
        if self._saved is not None:
            self.adapter.sync()
            for variable, value in self._saved:
                variable.assign(value)
            self.adapter.new_step()
            self._saved = None

    def _reserve(self) -> int:
        granted = self.worker.claims.reserve(self.batch_size)
        if 0 < granted < self.batch_size:  # excluded by check_budget_options: every grant is a whole batch
            raise RuntimeError(f"a grant of {granted} samples for a batch of {self.batch_size}: fast_tf needs whole")
        return granted

    def _state(self) -> Sequence[keras.Variable]:
        model = self.model
        return [*model.trainable_variables, *model.non_trainable_variables, *model.optimizer.variables]
