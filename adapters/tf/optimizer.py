"""DistributedOptimizer: the user's Keras optimizer, split so gradient strategies act between backward and step.

``model.fit`` compiles its train step (``tf.function``, ``jax.jit``), so a callback never sees the gradients.
Compiled with this optimizer, the step stores each gradient in non-trainable variables instead of applying it;
``fast_tf.Callback`` then reads them on the host, lets the strategy exchange them (all-reduce averages them, FAST
sends them to the neighbours) and applies the result with the wrapped optimizer's own ``apply``. Built only from
Keras' public optimizer API (``apply``, ``add_variable_from_reference``, ``variables``), so the same class works on
the TensorFlow, JAX (``stateless_apply`` runs this ``apply`` in a stateless scope) and torch backends.

Parameter strategies (D-PSGD, asynchronous averaging, ...) accept it too, so one script compiled with it serves every
strategy: the callback applies each stored gradient with the wrapped optimizer before the strategy mixes, which gives
the plain optimizer's numbers. Compiled with the plain optimizer instead, the update stays inside the compiled step
(one host copy of the gradient fewer a step, and ``steps_per_execution`` may exceed 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import keras


@keras.saving.register_keras_serializable(package="fast_tf")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wraps ``optimizer``: the compiled train step stores gradients, ``fast_tf.Callback`` applies them.

    ``model.compile(optimizer=fast_tf.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), ...)``.
    Learning rate, iterations, loss scaling and the optimizer state (saved with the model) are the wrapped
    optimizer's; ``variables`` also holds the stored gradients.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, name: str | None = None) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            raise TypeError("this optimizer is already a fast_tf.DistributedOptimizer; wrap the plain optimizer once")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                f"DistributedOptimizer wraps a keras.optimizers.Optimizer, got {type(optimizer).__name__}; e.g. "
                "fast_tf.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.optimizer = optimizer
        self.attached = False
        """True while a fast_tf.Callback trains with it: without one, stored gradients would never be applied."""

    def build(self, variables: Sequence[keras.Variable]) -> None:
        self.gradients = [self.add_variable_from_reference(v, name="fast_gradient") for v in variables]
        self._built_ids = tuple(id(v) for v in variables)  # a tuple: TensorFlow's tracking would wrap a dict
        if not self.optimizer.built:
            self.optimizer.build(variables)
        super().build(variables)

    @property
    def variables(self) -> list[keras.Variable]:
        return self._variables + self.optimizer.variables

    def apply(self, grads, trainable_variables=None) -> None:
        """Store ``grads`` (the compiled train step calls this); the variables are left as they are."""
        if not self.built:
            self.build(list(trainable_variables))
        if not self.attached:
            raise RuntimeError(
                "fast_tf.DistributedOptimizer stores each step's gradient for fast_tf.Callback to exchange and "
                "apply: train with model.fit(..., callbacks=[fast_tf.Callback(...)]); without the callback nothing "
                "would be applied"
            )
        slots = self.gradients
        if trainable_variables is not None:
            slot_of = {key: i for i, key in enumerate(self._built_ids)}
            try:
                slots = [self.gradients[slot_of[id(v)]] for v in trainable_variables]
            except KeyError:
                raise ValueError(
                    "DistributedOptimizer got a variable it was not built with; build a new optimizer for a new model"
                ) from None
        for slot, grad in zip(slots, grads, strict=True):
            self.assign(slot, keras.ops.zeros(slot.shape, dtype=slot.dtype))
            if grad is not None:  # assign_add also takes TensorFlow's sparse IndexedSlices (embeddings) correctly
                self.assign_add(slot, grad)

    # the wrapped optimizer's settings and counters --------------------------------------------------------------
    @property
    def learning_rate(self):
        return self.optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate) -> None:
        self.optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.optimizer.iterations

    def scale_loss(self, loss):
        return self.optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list) -> None:
        self.optimizer.finalize_variable_values(var_list)

    def get_config(self) -> dict:
        return {"name": self.name, "optimizer": keras.saving.serialize_keras_object(self.optimizer)}

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> DistributedOptimizer:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)
