"""A torch optimizer's per-parameter state as named NumPy arrays, and back: what checkpoints save and what a live
rank gives a replacement of a lost one (``fast_core.runtime.survival``), never pickled.

Names are ``optim/<parameter index>/<key>``; a number (Adam's step as a Python float) is a 0-d float64 array whose
name ends in ``#number``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

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


def optimizer_options(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter group's hyper-parameters (lr, momentum, betas, ...) as JSON data (a 1-element tensor as its
    number; tuples become lists)."""
    groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    return json.loads(json.dumps(groups, default=_option))


def load_optimizer(
    optimizer: torch.optim.Optimizer, arrays: Mapping[str, np.ndarray], options: Sequence[Mapping[str, Any]]
) -> None:
    """Load another optimizer's ``optimizer_arrays`` and ``optimizer_options`` (another rank's, or a saved copy)
    into ``optimizer``, whose own state may be empty (a new optimizer)."""
    state = optimizer.state_dict()
    if len(options) != len(state["param_groups"]):
        raise ValueError(
            f"the optimizer has {len(state['param_groups'])} parameter groups and the state given {len(options)}: "
            "build the same optimizer on every rank"
        )
    state["state"] = optimizer_state(arrays)
    for group, given in zip(state["param_groups"], options, strict=True):
        for key, value in given.items():
            group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
    optimizer.load_state_dict(state)


def _option(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    raise TypeError(f"an optimizer option of type {type(value).__name__} cannot be sent as JSON")
