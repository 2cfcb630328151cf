"""Tensor collectives for scripts: the mean, sum or rank-0 value of a metric or any tensors over all ranks.

What Horovod's ``hvd.allreduce(tensor)`` is used for (a validation loss, a count of correct answers): a value, a
tensor, or a list/tuple/dict of them, sent as one message for all, never pickled, and handed back in the same
structure with each tensor in its own dtype and on its own device. Every rank must call them together. The
structure and the checks are fast_core's (``fast_core.interop.nested``); this file says how a torch tensor crosses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import torch
from fast_core import Engine
from fast_core.interop import nested

from .staging import as_numpy


def average(value: Any, engine: Engine | None = None) -> Any:
    """The mean over ranks of every floating tensor or number in ``value`` (summed in float64)."""
    return nested.average(value, TORCH, engine)


def sum(value: Any, engine: Engine | None = None) -> Any:  # noqa: A001 - Horovod's and torch.distributed's name
    """The sum over ranks of every tensor or number in ``value`` (integers exact below 2**53)."""
    return nested.total(value, TORCH, engine)


def broadcast(value: Any, root: int = 0, engine: Engine | None = None) -> Any:
    """Rank ``root``'s ``value`` on every rank, bit for bit (any dtypes)."""
    return nested.broadcast(value, TORCH, root, engine)


def _host(tensor: torch.Tensor) -> np.ndarray:
    return np.asarray(as_numpy(tensor.detach()), order="C")  # ascontiguousarray would make 0-d tensors 1-d


def _back(tensor: torch.Tensor, array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array).reshape(tensor.shape)).to(device=tensor.device, dtype=tensor.dtype)


TORCH = nested.Tensors("fast_torch", lambda leaf: isinstance(leaf, torch.Tensor), _host, _back)
