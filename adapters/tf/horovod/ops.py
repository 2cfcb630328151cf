"""Horovod's Keras collectives on FAST: ``allreduce``, ``allgather`` and ``broadcast`` of a tensor, a NumPy array
or a number (each result in its own dtype and shape), and ``broadcast_object`` as JSON, never a pickle."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from fast_core import Engine
from fast_core.engine.collectives import broadcast_arrays
from fast_core.interop import horovod
from fast_core.runtime.process import init as default_engine

from .. import collectives
from .graph import in_graph, on_host


def _engine() -> Engine:
    return default_engine()


def allreduce(
    value: Any,
    name: str | None = None,
    average: bool | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    op: horovod.ReduceOp | None = None,
    compression: Any = None,
    process_set: Any = horovod.global_process_set,
) -> Any:
    """The reduction of ``value`` over all ranks (the mean by default), as a tensor of its dtype and shape."""
    op = horovod.resolve_op(op, average)
    horovod.check_compression(compression, _engine())
    horovod.check_process_set(process_set)
    tensor = _tensor(value, "allreduce")
    if prescale_factor != 1.0:
        tensor = tensor * prescale_factor
    if in_graph():  # inside tf.function: the host collective as a graph op
        (reduced,) = on_host([tensor], lambda arrays: horovod.reduce_arrays(arrays, op, _engine()))
    else:
        reduced = horovod.reduce_tensor(tensor, op, collectives.KERAS, _engine())
    return reduced * postscale_factor if postscale_factor != 1.0 else reduced


def allgather(value: Any, name: str | None = None, process_set: Any = horovod.global_process_set) -> Any:
    """Every rank's ``value`` concatenated along the first dimension, in rank order (bit-exact)."""
    horovod.check_process_set(process_set)
    tensor = _tensor(value, "allgather")
    if in_graph():
        gather = [None, *tensor.shape[1:]]  # the ranks' first dimensions may differ
        return on_host([tensor], lambda arrays: [horovod.allgather_array(arrays[0], _engine())], [gather])[0]
    whole = horovod.allgather_array(np.asarray(keras.ops.convert_to_numpy(tensor)), _engine())
    return keras.ops.convert_to_tensor(whole, dtype=tensor.dtype)


def broadcast(
    value: Any, root_rank: int = 0, name: str | None = None, process_set: Any = horovod.global_process_set
) -> Any:
    """Rank ``root_rank``'s ``value`` as a tensor on every rank (bit-exact)."""
    horovod.check_process_set(process_set)
    tensor = _tensor(value, "broadcast")
    if in_graph():
        return on_host([tensor], lambda arrays: broadcast_arrays(arrays, _engine(), root_rank))[0]
    return collectives.broadcast(tensor, root=root_rank, engine=_engine())


def _tensor(value: Any, what: str) -> Any:
    if isinstance(value, dict | list | tuple | str | bytes) or value is None:
        raise TypeError(
            f"{what}() takes one tensor, array or number, got a {type(value).__name__}; for lists or dicts of "
            "them use fast_tf.average/sum/broadcast"
        )
    if isinstance(value, keras.Variable):
        return keras.ops.copy(value)
    return keras.ops.convert_to_tensor(value)


def grouped_allreduce(tensors: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
    """``allreduce`` of each tensor, with the same arguments."""
    return [allreduce(tensor, *args, **kwargs) for tensor in tensors]


def reducescatter(
    value: Any,
    name: str | None = None,
    op: horovod.ReduceOp | None = None,
    compression: Any = None,
    process_set: Any = horovod.global_process_set,
) -> Any:
    """The mean (``op=hvd.Sum``: the sum) of ``value`` over ranks, of which this rank keeps its rows of the first
    dimension (as even as possible, the first ranks one more), as a tensor of its dtype; inside ``tf.function``
    too."""
    op = horovod.resolve_op(op)
    horovod.check_compression(compression, _engine())
    horovod.check_process_set(process_set)
    tensor = _tensor(value, "reducescatter")

    def scatter(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [horovod.reducescatter_array(arrays[0], op, _engine())]

    if in_graph():
        engine = _engine()
        rows = tensor.shape[0]
        mine = None if rows is None else horovod.scatter_counts(rows, engine.size)[engine.rank]
        return on_host([tensor], scatter, [[mine, *tensor.shape[1:]]])[0]
    host = scatter([np.asarray(keras.ops.convert_to_numpy(tensor))])[0]
    return keras.ops.convert_to_tensor(host, dtype=tensor.dtype)


def alltoall(
    value: Any, splits: Any = None, name: str | None = None, process_set: Any = horovod.global_process_set
) -> tuple[Any, Any]:
    """Rows of ``value`` sent to each rank (``splits``: rows per rank, None: even), and from each rank the rows it
    sent to this one, in rank order; returns them and how many came from each rank (bit-exact; eagerly)."""
    horovod.check_process_set(process_set)
    if in_graph():
        raise NotImplementedError(
            "fast_tf.horovod.alltoall runs eagerly: call it outside tf.function (its output's size is known only "
            "once the ranks have sent their splits)"
        )
    tensor = _tensor(value, "alltoall")
    counts = None if splits is None else np.asarray(keras.ops.convert_to_numpy(splits))
    received, came = horovod.alltoall_array(np.asarray(keras.ops.convert_to_numpy(tensor)), counts, _engine())
    return keras.ops.convert_to_tensor(received, dtype=tensor.dtype), keras.ops.convert_to_tensor(came)
