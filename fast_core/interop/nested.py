"""The adapters' tensor collectives (``fast_torch.average``, ``fast_tf.sum``, ...), written once for every framework.

What Horovod's ``hvd.allreduce(tensor)`` is used for (a validation loss, a count of correct answers): a number, an
array, a framework tensor, or a list/tuple/dict of them, sent as one message for all, never pickled, and handed back
in the same structure with each value in its own type, dtype and shape. An adapter says only which leaves are its
tensors and how they cross to NumPy and back (``Tensors``); the structure, the checks and the messages are here.
Every rank must call them together.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fast_core.engine import Engine
from fast_core.engine.collectives import average_arrays, broadcast_arrays, check_same_arrays, sum_arrays
from fast_core.runtime.process import init as default_engine


@dataclass(frozen=True)
class Tensors:
    """A framework's tensors as the collectives see them."""

    module: str
    """The adapter's import name, for the hints in errors (``"fast_torch"``)."""
    is_tensor: Callable[[Any], bool]
    to_host: Callable[[Any], np.ndarray]
    """A C-ordered host copy of a tensor (0-d stays 0-d)."""
    back: Callable[[Any, np.ndarray], Any]
    """A tensor like the leaf (dtype, shape, device) holding the result's values."""


def average(value: Any, tensors: Tensors, engine: Engine | None = None) -> Any:
    """The mean over ranks of every floating tensor or number in ``value`` (summed in float64); Python ints count as
    floats, integer tensors and arrays are refused (their mean is not an integer)."""
    value = rebuild(value, tensors, lambda leaf: builtins.float(leaf) if isinstance(leaf, int) else leaf)  # 3 -> 3.0
    return _collective(value, tensors, engine, "average()", average_arrays, _refuse_integers)


def total(value: Any, tensors: Tensors, engine: Engine | None = None) -> Any:
    """The sum over ranks of every tensor or number in ``value`` (integers exact below 2**53)."""
    return _collective(value, tensors, engine, "sum()", sum_arrays)


def broadcast(value: Any, tensors: Tensors, root: int = 0, engine: Engine | None = None) -> Any:
    """Rank ``root``'s ``value`` on every rank, bit for bit (any dtypes)."""
    engine = engine or default_engine()
    if not 0 <= root < engine.size:
        raise ValueError(f"broadcast root {root} is not a rank: give 0 to {engine.size - 1}")
    return _collective(value, tensors, engine, "broadcast()", lambda a, e: broadcast_arrays(a, e, root))


def rebuild(value: Any, tensors: Tensors, visit: Callable[[Any], Any]) -> Any:
    """``value`` with each tensor or number replaced by ``visit(leaf)``, in one order on every rank (dicts by
    sorted key, returned in the caller's key order)."""
    number = isinstance(value, int | float | np.number | np.ndarray) and not isinstance(value, bool)
    if number or tensors.is_tensor(value):
        return visit(value)
    if isinstance(value, dict):
        rebuilt = {key: rebuild(value[key], tensors, visit) for key in sorted(value, key=str)}
        return {key: rebuilt[key] for key in value}
    if isinstance(value, list | tuple):
        items = [rebuild(item, tensors, visit) for item in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # namedtuples too
    raise TypeError(
        f"cannot reduce a {type(value).__name__}: give a tensor, a number, or a list, tuple or dict of them"
    )


def _collective(
    value: Any,
    tensors: Tensors,
    engine: Engine | None,
    what: str,
    reduce: Callable[[list[np.ndarray], Engine], Sequence[np.ndarray]],
    check: Callable[[list[Any], list[np.ndarray], Tensors], None] | None = None,
) -> Any:
    engine = engine or default_engine()
    leaves: list[Any] = []
    rebuild(value, tensors, leaves.append)
    arrays = [tensors.to_host(leaf) if tensors.is_tensor(leaf) else np.asarray(leaf) for leaf in leaves]
    check_same_arrays(arrays, engine, what)  # first: then a refusal below happens on every rank alike
    if check is not None:
        check(leaves, arrays, tensors)
    results = iter(reduce(arrays, engine))
    return rebuild(value, tensors, lambda leaf: _back(leaf, next(results), tensors))


def _refuse_integers(leaves: list[Any], arrays: list[np.ndarray], tensors: Tensors) -> None:
    for leaf, array in zip(leaves, arrays, strict=True):
        if np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_:
            kind = "tensor" if tensors.is_tensor(leaf) else "array"
            raise TypeError(
                f"average() got a {kind} of {array.dtype}: the mean of integers is not an integer; use "
                f"{tensors.module}.sum() for counts, or pass a floating {kind}"
            )


def _back(leaf: Any, array: np.ndarray, tensors: Tensors) -> Any:
    if tensors.is_tensor(leaf):
        return tensors.back(leaf, array)
    if isinstance(leaf, np.ndarray):
        return array.astype(leaf.dtype)
    if isinstance(leaf, np.number):
        return array.astype(leaf.dtype)[()]  # a NumPy scalar again
    return builtins.float(array) if isinstance(leaf, float) else array.item()
