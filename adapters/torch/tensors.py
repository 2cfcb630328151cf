"""A module's tensors through fast_core's whole-job collectives: one message for all of them, no pickling."""

from __future__ import annotations

import numpy as np

import torch
from fast_core import Engine
from fast_core.engine.collectives import average_arrays, broadcast_arrays

from .staging import as_numpy


def floating_tensors(model: torch.nn.Module, parameters: bool = True, buffers: bool = True) -> list[torch.Tensor]:
    """The model's parameters and/or floating buffers (e.g. BatchNorm running statistics), non-empty ones."""
    tensors = list(model.parameters()) if parameters else []
    if buffers:
        tensors += [b for b in model.buffers() if b.dtype.is_floating_point]
    return [t for t in tensors if t.numel()]


def broadcast_tensors(tensors: list[torch.Tensor], engine: Engine, root: int = 0) -> None:
    """Overwrite the tensors on every rank with ``root``'s (collective; one bit-exact message for all)."""
    _load(tensors, broadcast_arrays([as_numpy(t) for t in tensors], engine, root))


def average_tensors(tensors: list[torch.Tensor], engine: Engine) -> None:
    """Replace the tensors on every rank by their mean over ranks (collective; one message, summed in float64)."""
    _load(tensors, average_arrays([as_numpy(t) for t in tensors], engine))


def _load(tensors: list[torch.Tensor], values: list[np.ndarray]) -> None:
    with torch.no_grad():
        for tensor, value in zip(tensors, values, strict=True):
            tensor.copy_(torch.from_numpy(value))  # back to the tensor's own dtype and device
