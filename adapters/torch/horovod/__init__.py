"""Horovod's PyTorch API on FAST: a Horovod script runs under ``fast run`` with one changed import.

    import fast_torch.horovod as hvd        # instead of: import horovod.torch as hvd

``init``, ``rank``, ``size``, ``local_rank``, ``local_size``, ``DistributedOptimizer`` (all-reduce of the
gradients by default; any FAST strategy through ``fast run --strategy``), ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object``, ``allreduce``/``allgather``/``broadcast`` of tensors,
``Compression``, ``Average``/``Sum``/``Min``/``Max``. What FAST cannot honour (Adasum, process sets, elastic
training, NCCL or Gloo specifics) raises an error that says so and what to use instead.
"""

from __future__ import annotations

from typing import Any

from fast_core.horovod import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
    check_init,
    global_process_set,
    missing,
    poll,
    synchronize,
)
from fast_core.runtime import init as _fast_init
from fast_core.runtime import local_rank, local_size, rank, size

from .compression import Compression
from .lifecycle import shutdown
from .ops import (
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allreduce,
)
from .optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters

_TORCH_ONLY = {
    "SyncBatchNorm": "BatchNorm statistics stay local while training and fast_torch.average_model(model) averages "
    "them",
    "join": "wrap the loop in `with fast_torch.join(optimizer):` for ranks with uneven data",
    "sparse_allreduce_async": "sparse all-reduce: use dense gradients",
}

_started = [False]


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start FAST (MPI under ``fast run`` or ``mpiexec``, else one worker). ``comm`` and ``process_sets`` must be
    None: FAST always trains on all ranks of its launch."""
    check_init(comm, process_sets)
    _fast_init()
    _started[0] = True


def is_initialized() -> bool:
    return _started[0]


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def nccl_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def __getattr__(name: str) -> Any:
    raise missing("fast_torch.horovod", name, _TORCH_ONLY)


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "nccl_built",
    "poll",
    "rank",
    "shutdown",
    "size",
    "synchronize",
]
