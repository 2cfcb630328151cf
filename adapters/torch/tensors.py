"""Collectives over a module's tensors, one tensor at a time through NumPy views (no pickling)."""

from __future__ import annotations

import numpy as np

import torch
from fast_core import Engine


def floating_tensors(model: torch.nn.Module, parameters: bool = True, buffers: bool = True) -> list[torch.Tensor]:
    """The model's parameters and/or floating buffers (e.g. BatchNorm running statistics), non-empty ones."""
    tensors = list(model.parameters()) if parameters else []
    if buffers:
        tensors += [b for b in model.buffers() if b.dtype.is_floating_point]
    return [t for t in tensors if t.numel()]


def broadcast_tensors(tensors: list[torch.Tensor], engine: Engine, root: int = 0) -> None:
    """Overwrite each tensor on every rank with ``root``'s (collective)."""
    for tensor in tensors:
        data = np.ascontiguousarray(tensor.detach().numpy())
        engine.broadcast(data, root=root)
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(data.reshape(tensor.shape)))


def average_tensors(tensors: list[torch.Tensor], engine: Engine) -> None:
    """Replace each tensor on every rank by its mean over ranks (collective; summed in float64)."""
    for tensor in tensors:
        data = np.ascontiguousarray(tensor.detach().numpy(), dtype=np.float64)
        engine.allreduce(data)
        data /= engine.size
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(data.reshape(tensor.shape)))
