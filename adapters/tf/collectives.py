"""Tensor collectives for scripts: the mean, sum or rank-0 value of a metric or any tensors over all ranks.

What Horovod's ``hvd.allreduce(tensor)`` is used for (a validation loss, a count of correct answers): a number, a
NumPy array, a Keras tensor (``keras.ops``, any backend) or variable, or a list/tuple/dict of them, sent as one
message for all, never pickled, and handed back in the same structure with each value in its own dtype and shape (a
variable comes back as a tensor; the variable is left as it is). Every rank must call them together. The structure
and the checks are fast_core's (``fast_core.interop.nested``); this file says how a Keras tensor crosses.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from fast_core import Engine
from fast_core.interop import nested


def average(value: Any, engine: Engine | None = None) -> Any:
    """The mean over ranks of every floating tensor or number in ``value`` (summed in float64), e.g. a validation
    loss: ``fast_tf.average(model.evaluate(x, y, return_dict=True))``."""
    return nested.average(value, KERAS, engine)


def sum(value: Any, engine: Engine | None = None) -> Any:  # noqa: A001 - Horovod's and torch.distributed's name
    """The sum over ranks of every tensor or number in ``value`` (integers exact below 2**53), e.g. counts."""
    return nested.total(value, KERAS, engine)


def broadcast(value: Any, root: int = 0, engine: Engine | None = None) -> Any:
    """Rank ``root``'s ``value`` on every rank, bit for bit (any dtypes)."""
    return nested.broadcast(value, KERAS, root, engine)


def _is_tensor(leaf: Any) -> bool:
    return isinstance(leaf, keras.Variable) or keras.ops.is_tensor(leaf)


def _host(tensor: Any) -> np.ndarray:
    if isinstance(tensor, keras.Variable):  # its value as a tensor: NumPy 2 warns converting a variable itself
        tensor = keras.ops.copy(tensor)
    return np.asarray(keras.ops.convert_to_numpy(tensor), order="C")  # ascontiguousarray would make 0-d arrays 1-d


def _back(tensor: Any, array: np.ndarray) -> Any:
    values = np.array(array).reshape(tuple(tensor.shape))  # fresh: JAX may keep NumPy memory, nothing writes it again
    return keras.ops.convert_to_tensor(values, dtype=keras.backend.standardize_dtype(tensor.dtype))


KERAS = nested.Tensors("fast_tf", _is_tensor, _host, _back)
