"""Horovod's Keras API on FAST: a Horovod Keras script runs under ``fast run`` with one changed import.

    import fast_tf.horovod as hvd        # instead of: import horovod.tensorflow.keras as hvd (or horovod.keras)

``init``, ``rank``, ``size``, ``local_rank``, ``local_size``, ``DistributedOptimizer`` (FAST's: all-reduce of
the gradients by default, any FAST strategy through ``fast run --strategy``), ``callbacks``
(``BroadcastGlobalVariablesCallback``, which runs FAST's strategy, ``MetricAverageCallback``,
``LearningRateWarmupCallback``, ``LearningRateScheduleCallback``), ``allreduce``/``allgather``/``broadcast``,
``broadcast_object`` (JSON), ``Compression``, ``Average``/``Sum``/``Min``/``Max``; for a TensorFlow 2 custom loop
(``import horovod.tensorflow as hvd``), ``DistributedGradientTape``, ``PartialDistributedGradientTape`` and
``broadcast_variables``, which like the collectives work inside ``tf.function`` too; elastic training
(``elastic.run``, ``elastic.KerasState``, under ``fast run --fault-tolerant``). What FAST cannot honour raises an
error that says so.
"""

from __future__ import annotations

from typing import Any

import keras

from fast_core.interop.horovod import *  # noqa: F403 - Horovod's names: Average, Sum, init, rank, size, local_rank, ...
from fast_core.interop.horovod import (
    Average,
    ReduceOp,
    check_optimizer_options,
    check_process_set,
    compression_wire,
    global_process_set,
    missing,
    resolve_op,
)
from fast_core.interop.horovod import __all__ as _common

from ..optimizer import DistributedOptimizer as _FastOptimizer
from . import callbacks, elastic
from .ops import allgather, allreduce, alltoall, broadcast, grouped_allreduce, reducescatter
from .tape import DistributedGradientTape, PartialDistributedGradientTape, broadcast_variables


class Compression:
    """``hvd.Compression.none`` and ``hvd.Compression.fp16``: given to ``DistributedOptimizer``, fp16 makes the
    default all-reduce ``allreduce:compress=fp16`` (the gradients summed in a ring of fp16 messages, as in
    fast_torch.horovod); a metric's ``allreduce`` sends its tensor as it is (said once)."""

    class none:  # noqa: N801 - Horovod's name
        wire = "none"

    class fp16:  # noqa: N801 - Horovod's name
        wire = "fp16"


def shutdown() -> None:
    """Nothing to do: FAST's callback closes its worker at the end of each fit."""


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: ReduceOp = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = global_process_set,
    scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:
    """``fast_tf.DistributedOptimizer(optimizer)``: the compiled step hands each gradient to FAST's callback
    (``hvd.callbacks.BroadcastGlobalVariablesCallback``), which reduces it with the strategy and applies it with
    ``optimizer``; harmless under strategies that mix parameters. Only ``op=hvd.Average`` and one backward pass
    per step: Keras' ``fit`` takes one gradient per step."""
    op = resolve_op(op)
    check_optimizer_options(op, gradient_predivide_factor, backward_passes_per_step)
    if op is not Average:
        raise ValueError("fast_tf.horovod.DistributedOptimizer averages the gradients: use op=hvd.Average")
    if backward_passes_per_step != 1:
        raise ValueError(
            "backward_passes_per_step > 1 is not supported by fast_tf.horovod: model.fit applies one gradient per "
            "step; use a larger batch_size instead"
        )
    compression_wire(compression)  # Horovod's two compressors; anything else is refused here
    check_process_set(process_set)
    distributed = _FastOptimizer(optimizer, name=name)
    distributed.compression = compression  # the callback's strategy: all-reduce in fp16 messages under fp16
    return distributed


_KERAS_ONLY = {
    "load_model": "load the model with keras.models.load_model and compile it with hvd.DistributedOptimizer",
    "broadcast_global_variables": "use hvd.callbacks.BroadcastGlobalVariablesCallback(0) in fit's callbacks",
    "SyncBatchNormalization": "no synchronized batch norm: BatchNormalization's statistics stay each rank's own",
    "size_op": "TensorFlow 1's graph ops: hvd.size() and hvd.rank() are Python ints, constants in a tf.function",
    "rank_op": "TensorFlow 1's graph ops: hvd.size() and hvd.rank() are Python ints, constants in a tf.function",
}


def __getattr__(name: str) -> Any:
    raise missing("fast_tf.horovod", name, _KERAS_ONLY)


__all__ = [
    *_common,
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "PartialDistributedGradientTape",
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "broadcast_variables",
    "callbacks",
    "elastic",
    "grouped_allreduce",
    "reducescatter",
    "shutdown",
]
