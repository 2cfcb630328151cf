"""Tensor collectives for scripts: the mean, sum or rank-0 value of a metric or any tensors over all ranks.

What Horovod's ``hvd.allreduce(tensor)`` is used for (a validation loss, a count of correct answers): a value, a
tensor, or a list/tuple/dict of them, sent as one message for all, never pickled, and handed back in the same
structure with each tensor in its own dtype and on its own device. Every rank must call them together.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

import numpy as np

import torch
from fast_core import Engine
from fast_core.collectives import average_arrays, broadcast_arrays, check_same_arrays, sum_arrays
from fast_core.runtime import init as default_engine

from .staging import as_numpy


def average(value: Any, engine: Engine | None = None) -> Any:
    """The mean over ranks of every floating tensor or number in ``value`` (summed in float64)."""
    value = _rebuild(value, lambda leaf: builtins.float(leaf) if isinstance(leaf, int) else leaf)  # 3 -> 3.0
    leaves = _leaves(value)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and not leaf.dtype.is_floating_point:
            raise TypeError(
                f"average() got a {leaf.dtype} tensor: the mean of integers is not an integer; use "
                "fast_torch.sum() for counts, or pass a floating tensor"
            )
    return _collective(value, leaves, engine, "average()", average_arrays)


def sum(value: Any, engine: Engine | None = None) -> Any:  # noqa: A001 - Horovod's and torch.distributed's name
    """The sum over ranks of every tensor or number in ``value`` (integers exact below 2**53)."""
    return _collective(value, _leaves(value), engine, "sum()", sum_arrays)


def broadcast(value: Any, root: int = 0, engine: Engine | None = None) -> Any:
    """Rank ``root``'s ``value`` on every rank, bit for bit (any dtypes)."""
    engine = engine or default_engine()
    if not 0 <= root < engine.size:
        raise ValueError(f"broadcast root {root} is not a rank: give 0 to {engine.size - 1}")
    return _collective(value, _leaves(value), engine, "broadcast()", lambda a, e: broadcast_arrays(a, e, root))


def _collective(
    value: Any, leaves: list[Any], engine: Engine | None, what: str, reduce: Callable[[list[np.ndarray], Engine], Any]
) -> Any:
    engine = engine or default_engine()
    arrays = [_host(leaf) for leaf in leaves]
    check_same_arrays(arrays, engine, what)
    results = iter(reduce(arrays, engine))
    return _rebuild(value, lambda leaf: _back(leaf, next(results)))


def _leaves(value: Any) -> list[Any]:
    found: list[Any] = []
    _rebuild(value, lambda leaf: found.append(leaf))
    return found


def _rebuild(value: Any, visit: Callable[[Any], Any]) -> Any:
    """``value`` with each tensor or number replaced by ``visit(leaf)``, in a fixed order (dicts by sorted key)."""
    if isinstance(value, torch.Tensor | int | float | np.number | np.ndarray) and not isinstance(value, bool):
        return visit(value)
    if isinstance(value, dict):
        rebuilt = {key: _rebuild(value[key], visit) for key in sorted(value, key=str)}
        return {key: rebuilt[key] for key in value}
    if isinstance(value, list | tuple):
        rebuilt = [_rebuild(item, visit) for item in value]
        if isinstance(value, list):
            return rebuilt
        return type(value)(*rebuilt) if hasattr(value, "_fields") else type(value)(rebuilt)  # namedtuples too
    raise TypeError(
        f"cannot reduce a {type(value).__name__}: give a tensor, a number, or a list, tuple or dict of them"
    )


def _host(leaf: Any) -> np.ndarray:
    if isinstance(leaf, torch.Tensor):
        return np.asarray(as_numpy(leaf.detach()), order="C")  # ascontiguousarray would make 0-d tensors 1-d
    return np.asarray(leaf)


def _back(leaf: Any, array: np.ndarray) -> Any:
    if isinstance(leaf, torch.Tensor):
        return torch.from_numpy(np.array(array).reshape(leaf.shape)).to(device=leaf.device, dtype=leaf.dtype)
    if isinstance(leaf, np.ndarray | np.number):
        return array.astype(leaf.dtype)
    return builtins.float(array) if isinstance(leaf, float) else array.item()
