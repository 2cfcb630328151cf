"""Horovod's custom-loop calls for TensorFlow 2: ``DistributedGradientTape``, ``PartialDistributedGradientTape`` and
``broadcast_variables``, eagerly and inside ``tf.function`` (``graph.on_host``).

A Horovod TF2 loop computes its gradients with a tape and applies them itself; the wrapped tape's ``gradient``
returns every rank's mean gradient (Horovod's rule: one all-reduce of all of them per call, as one message), so the
loop's own ``optimizer.apply_gradients`` keeps the replicas equal once ``broadcast_variables`` gave them rank 0's
start. FAST's other strategies need FAST's hooks around the step: ``fast_tf.Callback`` under ``model.fit``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fast_core.engine import Engine
from fast_core.engine.collectives import broadcast_arrays
from fast_core.interop import horovod
from fast_core.runtime.process import init as default_engine

from .graph import on_host, tensorflow


class DistributedGradientTape:
    """A ``tf.GradientTape`` whose ``gradient`` returns the mean (``op=hvd.Sum``: the sum) of every rank's
    gradient; ``local_sources`` keep their own rank's gradient (``PartialDistributedGradientTape``). Everything else
    is the tape's own (``watch``, ``stop_recording``, ...)."""

    def __init__(
        self,
        gradtape: Any,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Any = None,
        sparse_as_dense: bool = False,
        op: horovod.ReduceOp | None = None,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: Any = None,
        process_set: Any = horovod.global_process_set,
        scale_local_gradients: bool = True,
        local_sources: Iterable[Any] = (),
        engine: Engine | None = None,
    ) -> None:
        self._tape = gradtape
        self._engine = engine or default_engine()
        self._op = horovod.resolve_op(op)
        if self._op not in (horovod.Average, horovod.Sum):
            raise ValueError(
                "fast_tf.horovod.DistributedGradientTape averages or sums the gradients: op=hvd.Average "
                "or hvd.Sum (Adasum, Min and Max are not gradient reductions FAST offers)"
            )
        horovod.check_optimizer_options(self._op, gradient_predivide_factor, 1)
        horovod.check_compression(compression, self._engine)
        horovod.check_process_set(process_set)
        self._local = {id(source) for source in local_sources}  # Keras' variables and TensorFlow's alike

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **options: Any) -> Any:
        """The tape's gradients of ``target`` for ``sources``, each reduced over all ranks in one collective (an
        unconnected source's None stays None on every rank; sparse gradients are reduced dense)."""
        tf = tensorflow()
        grads = self._tape.gradient(target, sources, output_gradients=output_gradients, **options)
        flat, flat_sources = tf.nest.flatten(grads), tf.nest.flatten(sources)
        pairs = enumerate(zip(flat, flat_sources, strict=True))
        shared = [i for i, (g, source) in pairs if g is not None and id(source) not in self._local]
        tensors = [tf.convert_to_tensor(flat[i]) for i in shared]
        reduced = on_host(tensors, lambda arrays: horovod.reduce_arrays(arrays, self._op, self._engine))
        for i, value in zip(shared, reduced, strict=True):
            flat[i] = value
        return tf.nest.pack_sequence_as(grads, flat)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)


def PartialDistributedGradientTape(  # noqa: N802 - Horovod's name
    gradtape: Any, local_layers: Any = None, **options: Any
) -> DistributedGradientTape:
    """``DistributedGradientTape`` whose ``local_layers`` (a layer or a list of them) keep their own rank's
    gradients, as Horovod's: their variables are trained apart on each rank."""
    layers = [] if local_layers is None else local_layers if isinstance(local_layers, list | tuple) else [local_layers]
    local = [variable for layer in layers for variable in layer.trainable_weights]
    return DistributedGradientTape(gradtape, local_sources=local, **options)


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0, process_set: Any = horovod.global_process_set):
    """Give every rank ``root_rank``'s values of ``variables`` (one message for all, bit-exact), eagerly or inside
    ``tf.function`` (then it returns the op that assigns them)."""
    tf = tensorflow()
    horovod.check_process_set(process_set)
    variables = list(variables)
    engine = default_engine()
    if not 0 <= root_rank < engine.size:
        raise ValueError(f"broadcast_variables: root_rank {root_rank} is not a rank: give 0 to {engine.size - 1}")
    values = on_host(
        [tf.convert_to_tensor(v) for v in variables], lambda arrays: broadcast_arrays(arrays, engine, root_rank)
    )
    assigned = [v.assign(value) for v, value in zip(variables, values, strict=True)]
    return None if tf.executing_eagerly() else tf.group(*assigned)
