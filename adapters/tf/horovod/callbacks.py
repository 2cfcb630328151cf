"""Horovod's Keras callbacks on FAST (``hvd.callbacks``).

``BroadcastGlobalVariablesCallback`` is FAST's own ``fast_tf.Callback``: every Horovod Keras script adds it, and
it is where FAST's strategy runs (all-reduce unless ``fast run --strategy`` picks another), starting every rank
from ``root_rank``'s weights, and after the first batch its optimizer state too. ``MetricAverageCallback`` asks it
to average the epoch's logs over ranks (under a shared budget, only after the epochs every rank finishes). The
learning-rate callbacks set the optimizer's rate each batch by Horovod's formulas; ``momentum_correction`` is
accepted and not applied (Keras 3 compiles the momentum into the step): said once, on rank 0, when the optimizer
has a momentum. ``BestModelCheckpoint`` saves the best
model on rank 0 alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import Any

import keras

from fast_core.runtime.process import init as default_engine

from ..callback import Callback
from ..variables import broadcast_variables

log = logging.getLogger("fast_tf")

_active: list[Callback] = []  # the BroadcastGlobalVariablesCallback of the fit in progress


class BroadcastGlobalVariablesCallback(Callback):
    """Start every rank from ``root_rank``'s weights and train with FAST's strategy (``fast_tf.Callback``'s
    keyword arguments pass through: ``strategy=``, ``batch_size=``, ...). Put it first in ``callbacks``."""

    def __init__(self, root_rank: int = 0, device: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.root_rank = root_rank
        self._optimizer_sent = False

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        self._optimizer_sent = False
        self.worker = None  # this fit's, once started
        super().on_train_begin(logs)  # rank 0's weights on every rank (after the first step: a model with no Input)
        _active[:] = [self]

    def _started(self) -> None:
        if self.root_rank != 0:
            broadcast_variables(self.model.weights, self.worker.engine, self.root_rank)
            self.adapter.new_step()

    def on_train_batch_begin(self, batch: int, logs: MutableMapping | None = None) -> None:
        super().on_train_batch_begin(batch, logs)  # the last batch's step ends here (a model with no Input starts)
        self._send_optimizer_state()

    def _send_optimizer_state(self) -> None:
        """After the first step, as Horovod: ``root_rank``'s optimizer state (its variables exist once it has
        applied a step) and weights on every rank, so a rank 0 restored from a checkpoint (Adam's moments) restores
        every rank. Under all-reduce only: under a strategy that mixes parameters each rank's optimizer state is
        its own by design. (Not in ``on_train_batch_end``: overriding it stops Keras' asynchronous dispatch.)"""
        if self._optimizer_sent or self.worker is None or self._deferred or self.worker.step < 1:
            return
        self._optimizer_sent = True
        optimizer = self.model.optimizer
        if self.worker.strategy.name != "allreduce" or optimizer is None or not optimizer.variables:
            return
        broadcast_variables([*self.model.weights, *optimizer.variables], self.worker.engine, self.root_rank)
        self.adapter.new_step()

    def on_train_end(self, logs: MutableMapping | None = None) -> None:
        super().on_train_end(logs)
        _active.clear()


def finish_step() -> None:
    """Run now the strategy of the batch that last ran, which the fit's BroadcastGlobalVariablesCallback would run at
    the next batch's start (Horovod's elastic commit at a batch's end must hold that batch's update)."""
    if _active:
        _active[0]._finish_step()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's logs over ranks, as Horovod's does; put it after BroadcastGlobalVariablesCallback."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        if not _active:
            raise ValueError(
                "hvd.callbacks.MetricAverageCallback needs hvd.callbacks.BroadcastGlobalVariablesCallback(0) before "
                "it in callbacks: that callback runs FAST's strategy and averages the logs"
            )
        _active[0].average_metrics = True


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """``initial_lr * multiplier`` between ``start_epoch`` and ``end_epoch``; ``multiplier`` is a number or a
    function of the epoch (fractional unless ``staircase``)."""

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        super().__init__()
        if initial_lr is None or initial_lr <= 0:
            raise ValueError(f"initial_lr must be a positive learning rate, got {initial_lr!r}")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch, m=float(multiplier): m)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.momentum_correction = momentum_correction
        self._epoch = 0

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        momentum = getattr(self.model.optimizer, "momentum", 0.0)
        if self.momentum_correction and momentum and default_engine().rank == 0:  # said, not silently dropped
            log.warning(
                "momentum_correction=True is not applied: Keras 3 compiles the optimizer's momentum (%s) into its "
                "step, so it stays as it is while the learning rate changes (pass momentum_correction=False to "
                "silence this)",
                momentum,
            )

    def on_epoch_begin(self, epoch: int, logs: MutableMapping | None = None) -> None:
        self._epoch = epoch
        if self.staircase:
            self._set(epoch)

    def on_train_batch_begin(self, batch: int, logs: MutableMapping | None = None) -> None:
        if not self.staircase:
            steps = self.steps_per_epoch or (self.params or {}).get("steps") or 1
            self._set(self._epoch + batch / steps)

    def _set(self, epoch: float) -> None:
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warm-up: from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``, each batch."""

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        size = default_engine().size

        def multiplier(epoch: float) -> float:
            return (epoch * (size - 1) / warmup_epochs + 1) / size

        super().__init__(initial_lr, multiplier, 0, warmup_epochs, False, momentum_correction, steps_per_epoch, verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose and default_engine().rank == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's ``BestModelCheckpoint``: ``keras.callbacks.ModelCheckpoint(save_best_only=True)`` that writes on
    rank 0 alone (every rank holds the same model under all-reduce; with ``MetricAverageCallback`` the monitored
    value is the ranks' mean). Horovod's estimator sets ``filepath``; here give it, e.g. ``"best.keras"``."""

    def __init__(
        self,
        filepath: str | None = None,
        monitor: str = "val_loss",
        verbose: int = 0,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        **options: Any,
    ) -> None:
        if filepath is None:
            raise ValueError(
                "BestModelCheckpoint(filepath=...): give the file to save the best model to, e.g. 'best.keras' "
                "(Horovod's Spark estimator sets it; FAST has no estimator)"
            )
        super().__init__(
            filepath, monitor=monitor, verbose=verbose, save_best_only=True, mode=mode, save_freq=save_freq, **options
        )

    def on_train_batch_end(self, batch: int, logs: MutableMapping | None = None) -> None:
        if default_engine().rank == 0:  # the others neither track the best nor write
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        if default_engine().rank == 0:
            super().on_epoch_end(epoch, logs)
