"""Horovod's TensorFlow collectives inside ``tf.function`` as well as eagerly: the host collective as a graph op.

A TF2 training loop is nearly always a ``tf.function``, where a tensor is symbolic and has no values to send. The
collective then runs as ``tf.numpy_function`` (TensorFlow's supported bridge to Python): when the graph executes, it
hands the op's inputs to the host collective as NumPy arrays and takes the results back in their dtypes and shapes.
Eagerly the same host collective runs directly. Every rank must run the same collectives in the same order, as
under Horovod; the op is stateful, so TensorFlow neither prunes nor reorders it against other stateful ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

HostCollective = Callable[[list[np.ndarray]], list[np.ndarray]]
"""A collective over NumPy arrays (``fast_core.engine.collectives.average_arrays`` with its engine, ...): one array
out per array in, each in the input's dtype and shape."""


def in_graph() -> bool:
    """Whether a TensorFlow graph is being traced (``tf.function``): Keras on TensorFlow, not executing eagerly."""
    import keras

    return keras.backend.backend() == "tensorflow" and not tensorflow().executing_eagerly()


def tensorflow() -> Any:
    """TensorFlow, or one line saying that these calls need it (Keras may run on JAX or torch here)."""
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError(
            "fast_tf.horovod's gradient tape and variable broadcast are TensorFlow's: pip install tensorflow-cpu "
            "(or use fast_tf.average/sum/broadcast on another Keras backend)"
        ) from None
    return tf


def on_host(tensors: Sequence[Any], host: HostCollective, shapes: Sequence[Any] | None = None) -> list[Any]:
    """``host`` applied to ``tensors`` (TensorFlow tensors), eagerly or as one op of the graph being traced;
    ``shapes``: the outputs' static shapes where they are not the inputs' (an allgather's first dimension)."""
    tf = tensorflow()
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    dtypes = [t.dtype for t in tensors]
    if tf.executing_eagerly():
        results = host([t.numpy() for t in tensors])
        return [tf.convert_to_tensor(a, dtype=d) for a, d in zip(results, dtypes, strict=True)]

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        return [np.asarray(a, dtype=d.as_numpy_dtype) for a, d in zip(host(list(arrays)), dtypes, strict=True)]

    outputs = tf.numpy_function(run, tensors, dtypes, stateful=True, name="fast_collective")
    for output, shape in zip(outputs, shapes or [t.shape for t in tensors], strict=True):
        output.set_shape(shape)  # numpy_function's outputs have unknown shapes otherwise
    return list(outputs)
