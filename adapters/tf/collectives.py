"""Whole-job operations on variables and on Keras logs: one collective each, never a pickle."""

from __future__ import annotations

import zlib
from collections.abc import MutableMapping, Sequence

import keras
import numpy as np

from fast_core import Engine

from .variables import layout_of, read_flat, write_flat


def broadcast_variables(variables: Sequence[keras.Variable], engine: Engine, root: int = 0) -> None:
    """Overwrite the variables on every rank with ``root``'s (collective; one float64 message for all)."""
    if variables:
        layout = layout_of(variables, dtype="float64")
        flat = read_flat(variables, layout)
        engine.broadcast(flat, root)
        write_flat(variables, layout, flat)


def average_variables(variables: Sequence[keras.Variable], engine: Engine) -> None:
    """Replace the variables on every rank by their mean over ranks (collective; summed in float64)."""
    if variables:
        layout = layout_of(variables, dtype="float64")
        flat = read_flat(variables, layout)
        engine.allreduce(flat)
        flat /= engine.size
        write_flat(variables, layout, flat)


def average_logs(logs: MutableMapping[str, object], engine: Engine) -> None:
    """Replace every number in ``logs`` by its mean over ranks, in place (collective: every rank must call it).

    Ranks must log the same names (they compile the same model); a difference raises on every rank instead of
    averaging unrelated numbers.
    """
    names = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.number)) and not isinstance(v, bool))
    low, high = min_max(engine, zlib.crc32("\0".join(names).encode()))
    if low != high:
        raise ValueError(
            f"rank {engine.rank} logs {names}, and another rank logs other names; every rank must compile the same "
            "metrics for fast_tf.Callback to average them"
        )
    values = np.array([float(logs[k]) for k in names], dtype=np.float64)
    engine.allreduce(values)
    values /= engine.size
    for name, value in zip(names, values, strict=True):
        logs[name] = float(value)


def min_max(engine: Engine, value: int) -> tuple[int, int]:
    """The smallest and largest ``value`` over ranks (two 8-byte allreduces): equal when all ranks agree."""
    low, high = np.array([value], dtype=np.int64), np.array([value], dtype=np.int64)
    engine.allreduce(low, op="min")
    engine.allreduce(high, op="max")
    return int(low[0]), int(high[0])
