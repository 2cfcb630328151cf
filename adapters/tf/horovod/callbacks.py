"""Horovod's Keras callbacks on FAST (``hvd.callbacks``).

``BroadcastGlobalVariablesCallback`` is FAST's own ``fast_tf.Callback``: every Horovod Keras script adds it, and
it is where FAST's strategy runs (all-reduce unless ``fast run --strategy`` picks another), starting every rank
from ``root_rank``'s weights. ``MetricAverageCallback`` asks it to average the epoch's logs over ranks (under a
shared budget, only after the epochs every rank finishes). The learning-rate callbacks set the optimizer's rate
each batch by Horovod's formulas; ``momentum_correction`` is accepted and not applied (Keras 3 compiles the
momentum into the step).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

import keras

from fast_core.runtime.process import init as default_engine

from ..callback import Callback
from ..variables import broadcast_variables

_active: list[Callback] = []  # the BroadcastGlobalVariablesCallback of the fit in progress


class BroadcastGlobalVariablesCallback(Callback):
    """Start every rank from ``root_rank``'s weights and train with FAST's strategy (``fast_tf.Callback``'s
    keyword arguments pass through: ``strategy=``, ``batch_size=``, ...). Put it first in ``callbacks``."""

    def __init__(self, root_rank: int = 0, device: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.root_rank = root_rank

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        super().on_train_begin(logs)  # rank 0's weights on every rank
        if self.root_rank != 0:
            broadcast_variables(self.model.weights, self.worker.engine, self.root_rank)
            self.adapter.new_step()
        _active[:] = [self]

    def on_train_end(self, logs: MutableMapping | None = None) -> None:
        super().on_train_end(logs)
        _active.clear()


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
        self._epoch = 0

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

        super().__init__(
            initial_lr, multiplier, 0, warmup_epochs, False, momentum_correction, steps_per_epoch, verbose
        )
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        if epoch == self.warmup_epochs - 1:
            self.model.optimizer.learning_rate = self.initial_lr
            if self.verbose and default_engine().rank == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self.initial_lr:g}.")
