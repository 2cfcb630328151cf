"""What Horovod's API means independently of a framework, written once for ``fast_torch.horovod`` and
``fast_tf.horovod``: its reduction operations, its one process set, objects sent as JSON (Horovod pickles them;
FAST never unpickles a peer's bytes), handles of operations that complete at once, and the names FAST does not
provide, each with what to use instead. Horovod's elastic training (``hvd.elastic``) is ``fast_core.interop.elastic``.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from fast_core.engine import Engine
from fast_core.engine.collectives import (
    JOB,
    average_arrays,
    check_same_arrays,
    gather_arrays,
    gather_texts,
    sum_arrays,
)
from fast_core.interop import (
    elastic,  # noqa: F401 - hvd.elastic: run, ObjectState (adapters add their states)
    nested,
)
from fast_core.runtime.process import init as _start
from fast_core.runtime.process import local_rank, local_size, rank, size
from fast_core.strategies import AllReduce, Strategy
from fast_core.strategies.spec import resolve_strategy

__all__ = [  # what fast_torch.horovod and fast_tf.horovod re-export as Horovod's own names
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "allgather_object",
    "barrier",
    "broadcast_object",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "size",
    "synchronize",
]

log = logging.getLogger("fast_core.interop.horovod")


class ReduceOp(enum.Enum):
    """Horovod's reduction operations; FAST performs Average, Sum, Min and Max."""

    AVERAGE = "average"
    SUM = "sum"
    ADASUM = "adasum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"


Average, Sum, Adasum, Min, Max, Product = ReduceOp  # hvd.Average, hvd.Sum, ...


class _GlobalProcessSet:
    def __repr__(self) -> str:
        return "hvd.global_process_set"


global_process_set = _GlobalProcessSet()
"""Horovod's set of all ranks; the only process set FAST has."""


def check_process_set(process_set: Any) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise ValueError(
            f"process_set={process_set!r}: FAST runs every collective over all ranks; process sets are not "
            "supported (run one job per group of ranks instead)"
        )


_started = [False]


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start FAST (MPI under ``fast run`` or ``mpiexec``, else one worker). ``comm`` and ``process_sets`` must be
    None: FAST always trains on all ranks of its launch."""
    if comm is not None or process_sets is not None:
        raise ValueError(
            "hvd.init(comm=..., process_sets=...) is not supported: FAST trains on all ranks of the launch; start "
            "one job per group of ranks instead"
        )
    _start()
    _started[0] = True


def is_initialized() -> bool:
    return _started[0]


def resolve_op(op: ReduceOp | None, average: bool | None = None) -> ReduceOp:
    """The operation asked for through ``op`` or Horovod's older ``average=`` flag; Average by default."""
    if op is not None and average is not None:
        raise ValueError("give op= or the older average=, not both")
    if op is None:
        op = Sum if average is False else Average
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op={op!r} is not one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max")
    if op is Adasum:
        raise ValueError(
            "op=hvd.Adasum is not supported by FAST: use op=hvd.Average (the default), or one of FAST's own "
            "strategies through `fast run --strategy` (e.g. dpsgd:ring, async:torus)"
        )
    if op is Product:
        raise ValueError("op=hvd.Product is not supported by FAST: use hvd.Sum, hvd.Average, hvd.Min or hvd.Max")
    return op


def check_optimizer_options(op: ReduceOp, gradient_predivide_factor: float, backward_passes_per_step: int) -> None:
    """DistributedOptimizer's options, checked as Horovod checks them."""
    if op not in (Average, Sum):
        raise ValueError(f"DistributedOptimizer reduces gradients with hvd.Average or hvd.Sum, not {op}")
    if gradient_predivide_factor <= 0 or (gradient_predivide_factor != 1.0 and op is not Average):
        raise ValueError("gradient_predivide_factor must be positive, and is only valid with op=hvd.Average")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")


RING_CODECS = ("fp16", "bf16", "int8")
"""FAST's codecs that all-reduce's ring sums through (``AllReduce(compress=...)``), accepted by name as
``compression=`` beside Horovod's two compressors."""


def compression_wire(compression: Any) -> str:
    """"none" or a codec of ``RING_CODECS``: Horovod's two compressors (their classes carry ``wire``) or one of
    FAST's codecs by name ("bf16", "int8"); anything else raises."""
    wire = "none" if compression is None else getattr(compression, "wire", None)
    if wire is None and isinstance(compression, str):
        wire = compression
    if wire not in ("none", *RING_CODECS):
        raise ValueError(
            f"compression={compression!r} is not one of hvd.Compression.none or hvd.Compression.fp16, or one of "
            f"FAST's all-reduce codecs by name: {', '.join(repr(c) for c in RING_CODECS[1:])}"
        )
    return wire


def check_compression(compression: Any, engine: Engine) -> None:
    """Accept Horovod's two compressors where FAST sends the tensor as it is (a metric's all-reduce, Keras'
    optimizer, whose strategy the callback chooses): fp16 is said once, on rank 0."""
    wire = compression_wire(compression)
    if wire != "none" and engine.rank == 0:
        log.warning(
            "compression %s is accepted, but this tensor is sent uncompressed (for a model's gradients give it to "
            "DistributedOptimizer, or run the strategy: fast run --strategy allreduce:compress=%s)",
            wire,
            wire,
        )


def compressed_strategy(compression: Any, strategy: Strategy | str | None, engine: Engine) -> Strategy | str | None:
    """The strategy of a Horovod DistributedOptimizer given ``compression``: under hvd.Compression.fp16 (or a
    FAST codec by name, "bf16", "int8") the default all-reduce becomes ``allreduce:compress=fp16`` (the gradients
    summed in a ring of fp16 messages, as Horovod does); another strategy is kept as it is, and said once (name
    ``compress=`` in its string)."""
    wire = compression_wire(compression)
    if wire == "none":
        return strategy
    resolved = resolve_strategy(strategy)
    if type(resolved) is AllReduce and resolved.compress == "none":
        return AllReduce(compress=wire)
    if engine.rank == 0:
        log.warning(
            "compression %s applies to all-reduce; under %s the messages are as its strategy string says (e.g. "
            "dpsgd:ring,compress=%s)",
            wire,
            resolved,
            wire,
        )
    return resolved


def reduce_min_max(values: np.ndarray, op: ReduceOp, engine: Engine) -> np.ndarray:
    """The element-wise minimum or maximum over ranks, in float64 (exact for every float and int below 2**53)."""
    values = np.array(values, dtype=np.float64, order="C")
    check_same_arrays([values], engine, f"allreduce(op=hvd.{op.name.capitalize()})")
    flat = values.reshape(-1)
    engine.allreduce(flat, op=op.value, kind=JOB)
    return flat.reshape(values.shape)


def reduce_arrays(arrays: Sequence[np.ndarray], op: ReduceOp | None, engine: Engine) -> list[np.ndarray]:
    """Horovod's reduction ``op`` over ranks of each array, each returned in its own dtype and shape: Average and
    Sum as one float64 message for all arrays (``average_arrays``, ``sum_arrays``), Min and Max one per array
    (``reduce_min_max``). Written once so that every Horovod call on arrays (``reducescatter``, ``allreduce`` inside
    ``tf.function``, ``DistributedGradientTape``) maps the operations alike; ``op`` is read by ``resolve_op`` (None:
    Average; Adasum and Product are refused there, with what to use instead)."""
    op = resolve_op(op)
    if op is Average:
        return average_arrays(arrays, engine)
    if op is Sum:
        return sum_arrays(arrays, engine)
    return [np.asarray(reduce_min_max(a, op, engine), dtype=np.asarray(a).dtype) for a in arrays]


def reduce_tensor(tensor: Any, op: ReduceOp, tensors: nested.Tensors, engine: Engine) -> Any:
    """Horovod's ``allreduce`` of one of an adapter's tensors (``tensors``: how it crosses to NumPy and back), as a
    tensor like it. The mean and the sum are the adapter's own ``average`` and ``sum`` (``nested``), because they
    also check that every rank passes the same shape and dtype and refuse the mean of an integer tensor; Min and Max
    are ``reduce_arrays`` of its host copy (``reduce_min_max`` checks the shapes)."""
    if op is Average:
        return nested.average(tensor, tensors, engine)
    if op is Sum:
        return nested.total(tensor, tensors, engine)
    (reduced,) = reduce_arrays([tensors.to_host(tensor)], op, engine)
    return tensors.back(tensor, reduced)


def mpi_enabled() -> bool:
    """True: FAST's collectives run over MPI (mpi4py) or its in-process engine."""
    return True


def mpi_built() -> bool:
    return True


def mpi_threads_supported() -> bool:
    """Whether this process's MPI granted MPI_THREAD_MULTIPLE (asynchronous strategies need it), as Horovod asks."""
    return _start().threads_supported


def nccl_built() -> bool:
    """False: no NCCL; GPU tensors cross to the host and back."""
    return False


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def barrier(process_set: Any = None) -> None:
    """Every rank waits here until all have arrived (Horovod's ``barrier``), or PeerTimeout naming the absent."""
    check_process_set(process_set)
    _start().barrier()


def scatter_counts(rows: int, size: int) -> list[int]:
    """Rows of a first dimension each rank keeps in a reducescatter: as even as possible, the first ranks one more
    (Horovod's split)."""
    return [rows // size + (r < rows % size) for r in range(size)]


def reducescatter_array(array: np.ndarray, op: ReduceOp, engine: Engine) -> np.ndarray:
    """The mean (``Average``) or sum over ranks of ``array``, of which this rank keeps its rows of the first
    dimension (``scatter_counts``), in ``array``'s dtype: Horovod's ``reducescatter``."""
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter(op=hvd.{op.name.capitalize()}): FAST reduce-scatters with Average or Sum")
    array = np.asarray(array)
    if array.ndim == 0:
        raise ValueError("reducescatter() splits the first dimension: give a tensor of at least one dimension")
    (reduced,) = reduce_arrays([array], op, engine)
    counts = scatter_counts(array.shape[0], engine.size)
    start = sum(counts[: engine.rank])
    return reduced[start : start + counts[engine.rank]].copy()


def alltoall_array(array: np.ndarray, splits: Any, engine: Engine) -> tuple[np.ndarray, np.ndarray]:
    """Horovod's ``alltoall``: rank r receives, from every rank in rank order, the rows that rank sends to r
    (``splits``: rows per destination rank; None splits the first dimension evenly). Returns the rows received
    and how many came from each rank. Bit-exact; every rank's rows travel to every rank (allgather), which suits
    the small exchanges (labels, indices, routing) it is used for."""
    array = np.asarray(array)
    size = engine.size
    if array.ndim == 0:
        raise ValueError("alltoall() splits the first dimension: give a tensor of at least one dimension")
    if splits is None:
        if array.shape[0] % size:
            raise ValueError(
                f"alltoall(): {array.shape[0]} rows do not split evenly over {size} ranks: give splits= (rows per rank)"
            )
        splits = [array.shape[0] // size] * size
    sent = np.asarray(splits, dtype=np.int64).reshape(-1)
    if sent.size != size or (sent < 0).any() or sent.sum() != array.shape[0]:
        raise ValueError(
            f"alltoall(splits={sent.tolist()}): give {size} counts >= 0 that add up to the {array.shape[0]} rows"
        )
    every_split = gather_arrays(sent, engine)  # what each rank sends to each
    every_array = gather_arrays(array, engine)
    me = engine.rank
    received = []
    for rows, split in zip(every_array, every_split, strict=True):
        start = int(split[:me].sum())
        received.append(rows[start : start + int(split[me])])
    return np.concatenate(received), np.array([split[me] for split in every_split], dtype=np.int64)


def allgather_array(array: np.ndarray, engine: Engine) -> np.ndarray:
    """Every rank's rows concatenated in rank order (``collectives.gather_arrays``): Horovod's allgather."""
    return np.concatenate(gather_arrays(array, engine))


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank, sent as JSON (never pickled): dicts, lists, strings, numbers,
    booleans and None (tuples come back as lists, dict keys as strings)."""
    check_process_set(process_set)
    engine = _start()
    text = to_json(obj, "broadcast_object") if engine.rank == root_rank else ""
    return json.loads(engine.broadcast_text(text, root_rank))


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (as JSON, as ``broadcast_object``)."""
    check_process_set(process_set)
    return [json.loads(text) for text in gather_texts(to_json(obj, "allgather_object"), _start())]


def to_json(obj: Any, what: str) -> str:
    try:
        return json.dumps(obj)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what}() sends JSON, never a pickle: {exc}; give dicts, lists, strings, numbers, booleans or None "
            "(e.g. a tensor as tensor.tolist())"
        ) from exc


class Handle:
    """What the ``*_async`` operations return: the operation has completed; ``synchronize`` gives its result."""

    def __init__(self, result: Any) -> None:
        self.result = result


def poll(handle: Handle) -> bool:
    """True: FAST's operations complete before their handle is returned."""
    return True


def synchronize(handle: Handle) -> Any:
    """The result of an ``*_async`` operation."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize() takes the handle an *_async operation returned, got {type(handle).__name__}")
    return handle.result


NOT_PROVIDED = {
    "ProcessSet": "process sets: every collective runs over all ranks",
    "add_process_set": "process sets: every collective runs over all ranks",
    "remove_process_set": "process sets: every collective runs over all ranks",
    "join": "hvd.join(): ranks with uneven data are handled by the adapter's join (fast_torch.join(optimizer))",
    "cross_rank": "cross_rank/cross_size: use rank()/size() and local_rank()/local_size()",
    "start_timeline": "Horovod's timeline: `fast run --profile` splits each rank's time by phase (docs/cli.md, "
    "Profile)",
    "stop_timeline": "Horovod's timeline: `fast run --profile` splits each rank's time by phase (docs/cli.md, "
    "Profile)",
    "cross_size": "cross_rank/cross_size: use rank()/size() and local_rank()/local_size()",
}


def missing(module: str, name: str, extra: dict[str, str] | None = None) -> AttributeError:
    """The error for a name ``module`` lacks: what FAST offers instead when it is one of Horovod's."""
    reasons = {**NOT_PROVIDED, **(extra or {})}
    if name in reasons:
        return AttributeError(f"{module} has no {name}: {reasons[name]}")
    return AttributeError(f"module {module!r} has no attribute {name!r}")
