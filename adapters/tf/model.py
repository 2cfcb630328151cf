"""A Keras model seen through fast_core's adapter contract, over host copies of its variables.

The flat parameter buffer is a cache: read from the variables the first time a step asks for it, written back by
``set_params``, and marked stale when the model trains (``new_step``). A strategy's mixing step therefore costs one
read and one write of all variables, and a step where the strategy does nothing touches no variable at all. On
the JAX backend, ``model.fit`` keeps the state outside the variables between epochs; every access first calls the
model's ``jax_state_sync`` (what ``Callback.model`` does), and the trainer reloads the variables after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np

from fast_core.model.flat import FlatLayout

from .variables import handoff, layout_of, read_flat, write_flat


class KerasModel:
    """Flat NumPy copies of a Keras model's trainable variables (and gradients), plus the optimizer that applies
    a flat gradient. ``reads`` and ``writes`` count whole-model copies, so tests can see what a step cost."""

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None) -> None:
        self.model = model
        self.variables: list[keras.Variable] = list(model.trainable_variables)
        if not self.variables:
            raise ValueError(
                "the model has no trainable variable: build it first (give it a keras.Input, or call it on a batch) "
                "and leave at least one layer trainable"
            )
        self.layout: FlatLayout = layout_of(self.variables)
        self.optimizer = optimizer
        self.gradient_store: Sequence[keras.Variable] | None = None
        """Variables the compiled step wrote this step's gradient to (fast_tf.DistributedOptimizer), if any."""
        self._params = self.layout.empty()
        self._grads = np.zeros(self.layout.size, dtype=self.layout.dtype)
        self._params_current = False
        self._apply: Callable[[list], None] | None = None
        self._apply_owner: keras.optimizers.Optimizer | None = None
        self.reads = 0
        self.writes = 0

    def new_step(self) -> None:
        """The model trained since the last read: the host copy of the parameters is stale (no variable touched)."""
        self._params_current = False

    def sync(self) -> None:
        """Attach the JAX trainer's state to the variables (a no-op on other backends and when already attached)."""
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()

    # adapter contract -------------------------------------------------------------------------------------------
    def params(self) -> np.ndarray:
        if not self._params_current:
            self.sync()
            read_flat(self.variables, self.layout, out=self._params)
            self.reads += 1
            self._params_current = True
        return self._params

    def set_params(self, flat: np.ndarray) -> None:
        if flat is not self._params:
            np.copyto(self._params, flat)
        self.sync()
        write_flat(self.variables, self.layout, self._params)
        self.writes += 1
        self._params_current = True

    def grads(self) -> np.ndarray:
        """The gradient of the step, as loaded by ``load_gradients`` and changed by the strategy (host only)."""
        return self._grads

    def set_grads(self, flat: np.ndarray) -> None:
        if flat is not self._grads:
            np.copyto(self._grads, flat)

    def apply_gradient(self, flat_grad: np.ndarray) -> None:
        """One step of the optimizer with this gradient, through its own ``apply`` (its state, schedule, clipping)."""
        if self.optimizer is None:
            raise RuntimeError(
                "applying a gradient needs the optimizer: compile with fast_tf.DistributedOptimizer(your_optimizer)"
            )
        source = handoff(flat_grad)
        grads = [
            keras.ops.convert_to_tensor(source[e.offset : e.offset + e.size].reshape(e.shape))
            for e in self.layout.entries
        ]
        self.sync()
        if self._apply is None or self._apply_owner is not self.optimizer:
            self._apply, self._apply_owner = compiled_apply(self.optimizer, self.variables), self.optimizer
        self._apply(grads)
        self._params_current = False

    def apply_own_gradient(self) -> None:
        """One optimizer step with this rank's gradient, as ``load_gradients`` read it and the strategy left it."""
        self.apply_gradient(self._grads)

    def reset_optimizer(self) -> None:
        """Zero the optimizer's state (momenta, accumulators), keeping its learning rate and iteration count, so a
        schedule goes on where it was."""
        optimizer = self.optimizer or self.model.optimizer
        keep = {id(optimizer.learning_rate), id(optimizer.iterations)}
        self.sync()
        for variable in optimizer.variables:
            if id(variable) not in keep:
                variable.assign(keras.ops.zeros(variable.shape, dtype=variable.dtype))

    # gradients stored by fast_tf.DistributedOptimizer ------------------------------------------------------------
    def load_gradients(self) -> np.ndarray:
        """Read the gradient the compiled step stored (one read of all gradient variables)."""
        if self.gradient_store is None:
            raise RuntimeError("no gradient store: compile the model with fast_tf.DistributedOptimizer(optimizer)")
        self.sync()
        read_flat(self.gradient_store, self.layout, out=self._grads)
        self.reads += 1
        return self._grads


def compiled_apply(optimizer: keras.optimizers.Optimizer, variables: list[keras.Variable]) -> Callable[[list], None]:
    """``optimizer.apply(grads, variables)`` as a function of ``grads``, compiled where that pays.

    The one backend-specific line of fast_tf: eager TensorFlow runs an optimizer's update op by op (4.5 ms for SGD
    with momentum on the example's 6 variables, 1.1 ms as a ``tf.function``); JAX (1 ms) and torch (0.2 ms) run
    it eagerly.
    """

    def apply(grads: list) -> None:
        optimizer.apply(grads, variables)

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(apply, reduce_retracing=True)
    return apply
