"""Horovod's tensor operations on FAST's whole-job collectives: ``allreduce``, ``allgather``, ``broadcast`` of a
tensor (each result in the tensor's own dtype, shape and device), and ``broadcast_object`` of JSON data.

Every value crosses as raw numbers; objects cross as JSON text, never as a pickle (Horovod pickles them), so a
script's objects must be JSON data (dicts, lists, strings, numbers, booleans, None). ``*_async`` complete at once
and return a handle for ``synchronize``, so scripts written for Horovod's background thread run unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from fast_core import Engine
from fast_core.interop import horovod
from fast_core.runtime.process import init as default_engine

from .. import collectives
from ..staging import as_numpy


def _engine() -> Engine:
    return default_engine()


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = None,
    op: horovod.ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = horovod.global_process_set,
) -> torch.Tensor:
    """A new tensor holding the reduction of ``tensor`` over all ranks (the mean by default), in its own dtype and
    on its own device; ``prescale_factor`` multiplies before the reduction, ``postscale_factor`` after."""
    op = horovod.resolve_op(op, average)
    horovod.check_compression(compression, _engine())
    horovod.check_process_set(process_set)
    _check_tensor(tensor, "allreduce")
    value = tensor * prescale_factor if prescale_factor != 1.0 else tensor
    reduced = horovod.reduce_tensor(value, op, collectives.TORCH, _engine())
    return reduced * postscale_factor if postscale_factor != 1.0 else reduced


def allreduce_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``allreduce`` written into ``tensor`` itself; returns it."""
    with torch.no_grad():
        return tensor.copy_(allreduce(tensor, *args, **kwargs))


def grouped_allreduce(tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> list[torch.Tensor]:
    """``allreduce`` of each tensor, with the same arguments."""
    return [allreduce(tensor, *args, **kwargs) for tensor in tensors]


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: Any = horovod.global_process_set
) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (the first dimension may
    differ between ranks, the others must agree); bit-exact, in the tensor's dtype and on its device."""
    horovod.check_process_set(process_set)
    _check_tensor(tensor, "allgather")
    whole = horovod.allgather_array(as_numpy(tensor), _engine())
    return torch.from_numpy(whole).to(device=tensor.device, dtype=tensor.dtype)


def broadcast(
    tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, process_set: Any = horovod.global_process_set
) -> torch.Tensor:
    """A new tensor holding rank ``root_rank``'s ``tensor`` (bit-exact)."""
    horovod.check_process_set(process_set)
    _check_tensor(tensor, "broadcast")
    return collectives.broadcast(tensor, root=root_rank, engine=_engine())


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None, **kwargs: Any) -> torch.Tensor:
    """``broadcast`` written into ``tensor`` itself; returns it."""
    with torch.no_grad():
        return tensor.copy_(broadcast(tensor, root_rank, name, **kwargs))


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = None,
    op: horovod.ReduceOp | None = None,
    process_set: Any = horovod.global_process_set,
) -> torch.Tensor:
    """The mean (``op=hvd.Sum``: the sum) of ``tensor`` over ranks, of which this rank keeps its rows of the first
    dimension (as even as possible, the first ranks one more), in the tensor's dtype and on its device."""
    op = horovod.resolve_op(op)
    horovod.check_compression(compression, _engine())
    horovod.check_process_set(process_set)
    _check_tensor(tensor, "reducescatter")
    mine = horovod.reducescatter_array(as_numpy(tensor), op, _engine())
    return torch.from_numpy(mine).to(device=tensor.device, dtype=tensor.dtype)


def alltoall(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = horovod.global_process_set
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``tensor`` sent to each rank (``splits``: rows per rank, None: even), and from each rank the rows it
    sent to this one, in rank order; returns them and how many came from each rank (bit-exact)."""
    horovod.check_process_set(process_set)
    _check_tensor(tensor, "alltoall")
    counts = None if splits is None else as_numpy(splits) if isinstance(splits, torch.Tensor) else splits
    received, came = horovod.alltoall_array(as_numpy(tensor), counts, _engine())
    return torch.from_numpy(received).to(device=tensor.device, dtype=tensor.dtype), torch.from_numpy(came)


def grouped_allreduce_async(tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(grouped_allreduce(tensors, *args, **kwargs))


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(allreduce(tensor, *args, **kwargs))


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(allreduce_(tensor, *args, **kwargs))


def allgather_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(allgather(tensor, *args, **kwargs))


def broadcast_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(broadcast(tensor, *args, **kwargs))


def reducescatter_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(reducescatter(tensor, *args, **kwargs))


def alltoall_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(alltoall(tensor, *args, **kwargs))


def broadcast_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> horovod.Handle:
    return horovod.Handle(broadcast_(tensor, *args, **kwargs))


def _check_tensor(tensor: Any, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{what}() takes a torch.Tensor, got {type(tensor).__name__}; for numbers, lists or dicts use "
            "fast_torch.average/sum/broadcast"
        )
