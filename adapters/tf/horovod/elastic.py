"""Horovod's elastic training for Keras (``hvd.elastic``) on FAST: ``run``, ``ObjectState``,
``TensorFlowKerasState`` (and ``KerasState``, its other name) and the elastic callbacks.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),   # FAST's strategy runs there
                 hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state)]

The run loop and the commit, restore and sync of state are fast_core's (``fast_core.interop.elastic``); here a
Keras model's and optimizer's variables only become NumPy arrays and back. Run under ``fast run --fault-tolerant
[--max-restarts K]`` for the job to survive a lost rank.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import keras
import numpy as np

from fast_core import Engine
from fast_core.interop.elastic import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, Part, State, run

from .callbacks import finish_step

__all__ = [
    "CommitStateCallback",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "KerasState",
    "ObjectState",
    "State",
    "TensorFlowKerasState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]


class TensorFlowKerasState(ObjectState):
    """Horovod's ``TensorFlowKerasState``: ``model`` (all its variables), ``optimizer`` (its variables; None: the
    model's compiled optimizer) and any other values as keyword arguments, each an attribute (``state.model``,
    ``state.epoch``). The model must be built (Horovod's rule: ``model.build(input_shape)``, or one ``fit`` step).
    ``backend`` (Horovod's, for TensorFlow 1) is accepted and not used. ``fast_engine``: the engine of this rank
    (None: this process's)."""

    def __init__(
        self,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer | None = None,
        backend: Any = None,
        *,
        fast_engine: Engine | None = None,
        **kwargs: Any,
    ) -> None:
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)` (or fit it for one step).")
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(fast_engine=fast_engine, model=model, optimizer=optimizer, **kwargs)

    def part(self, value: Any) -> Part | None:
        if isinstance(value, keras.Model):
            return _Variables(lambda: value.weights)
        if isinstance(value, keras.optimizers.Optimizer):
            return _Variables(lambda: _optimizer_variables(value, self.model))
        return None


KerasState = TensorFlowKerasState
"""Horovod's ``horovod.tensorflow.keras.elastic.KerasState``: the same state."""


class _Variables:
    """Keras variables as arrays named by position, assigned back in place."""

    def __init__(self, variables: Any) -> None:
        self.variables = variables

    def read(self) -> dict[str, Any]:
        return {str(i): np.asarray(v.numpy()) for i, v in enumerate(self.variables())}

    def write(self, values: dict[str, Any]) -> None:
        variables = self.variables()
        if len(variables) != len(values):
            raise ValueError(
                f"{len(variables)} variables here and {len(values)} in the state: build the same model and optimizer "
                "on every rank"
            )
        for i, variable in enumerate(variables):
            variable.assign(values[str(i)])


def _optimizer_variables(optimizer: keras.optimizers.Optimizer, model: keras.Model) -> list:
    """The optimizer's variables, built for the model's trainable ones first when it has taken no step yet (a
    process that replaced a lost rank receives the others' slots)."""
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    return list(optimizer.variables)


class CommitStateCallback(keras.callbacks.Callback):
    """Horovod's: ``state.commit()`` every ``batches_per_commit`` batches and at each epoch's end. The step FAST's
    callback runs at the next batch's start runs first, so a commit holds the batch's update."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: MutableMapping | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            finish_step()
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        finish_step()
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Horovod's: ``state.batch`` follows the batch number, 0 at each epoch's end; with ``steps_per_epoch`` the
    first epoch after a reset is shortened by the batches already done."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: MutableMapping | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: MutableMapping | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Horovod's: ``state.epoch`` counts the epochs trained across resets (Keras counts each fit from 0)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: MutableMapping | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: MutableMapping | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
