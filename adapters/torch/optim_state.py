"""A torch optimizer's per-parameter state as named NumPy arrays, and back: what checkpoints save and what a live
rank gives a replacement of a lost one (``fast_core.runtime.survival``), never pickled.

Names are ``optim/<parameter index>/<key>``; a number (Adam's step as a Python float) is a 0-d float64 array whose
name ends in ``#number``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import torch

from .staging import as_numpy

OPTIM = "optim/"
_NUMBER = "#number"


def optimizer_arrays(optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """The optimizer's per-parameter tensors and numbers as named arrays."""
    arrays = {}
    for index, values in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(values.items()):
            if isinstance(value, torch.Tensor):
                arrays[f"{OPTIM}{index}/{key}"] = as_numpy(value)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                arrays[f"{OPTIM}{index}/{key}{_NUMBER}"] = np.asarray(value, dtype=np.float64)
    return arrays


def optimizer_state(arrays: Mapping[str, np.ndarray]) -> dict[int, dict[str, object]]:
    """The ``state`` part of a torch optimizer state_dict from ``optimizer_arrays``' names (others are ignored)."""
    state: dict[int, dict[str, object]] = {}
    for name, value in arrays.items():
        if not name.startswith(OPTIM):
            continue
        index, key = name[len(OPTIM) :].split("/", 1)
        if key.endswith(_NUMBER):
            state.setdefault(int(index), {})[key.removesuffix(_NUMBER)] = value.item()
        else:
            state.setdefault(int(index), {})[key] = torch.from_numpy(np.array(value))
    return state
