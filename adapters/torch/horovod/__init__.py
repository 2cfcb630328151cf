"""Horovod's PyTorch API on FAST: a Horovod script runs under ``fast run`` with one changed import.

    import fast_torch.horovod as hvd        # instead of: import horovod.torch as hvd

``init``, ``rank``, ``size``, ``local_rank``, ``local_size``, ``DistributedOptimizer`` (all-reduce of the
gradients by default; any FAST strategy through ``fast run --strategy``), ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object``, ``allreduce``/``allgather``/``broadcast`` of tensors,
``Compression``, ``Average``/``Sum``/``Min``/``Max``, and elastic training (``elastic.run``, ``elastic.TorchState``,
under ``fast run --fault-tolerant``). What FAST cannot honour (Adasum, process sets, NCCL or Gloo specifics) raises
an error that says so and what to use instead.
"""

from __future__ import annotations

from typing import Any

from fast_core.interop.horovod import *  # noqa: F403 - Horovod's names: Average, Sum, init, rank, size, local_rank, ...
from fast_core.interop.horovod import __all__ as _common
from fast_core.interop.horovod import missing

from . import elastic
from .compression import Compression
from .lifecycle import shutdown
from .ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_async,
    reducescatter,
    reducescatter_async,
)
from .optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters

_TORCH_ONLY = {
    "SyncBatchNorm": "BatchNorm statistics stay local while training and fast_torch.average_model(model) averages them",
    "join": "wrap the loop in `with fast_torch.join(optimizer):` for ranks with uneven data",
    "sparse_allreduce_async": "sparse all-reduce: use dense gradients",
    "callbacks": "Horovod's callbacks are Keras': fast_tf.horovod.callbacks; a torch loop saves its best model with "
    "fast_torch.save_checkpoint",
}


def __getattr__(name: str) -> Any:
    raise missing("fast_torch.horovod", name, _TORCH_ONLY)


__all__ = [
    *_common,
    "Compression",
    "DistributedOptimizer",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "alltoall",
    "alltoall_async",
    "elastic",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "reducescatter",
    "reducescatter_async",
    "shutdown",
]
