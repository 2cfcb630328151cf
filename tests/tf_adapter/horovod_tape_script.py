"""Run under mpiexec with the TensorFlow backend: ``python -m mpi4py tests/tf_adapter/horovod_tape_script.py OUT``. A
Horovod TensorFlow 2 custom loop, written as Horovod's examples write it (a ``tf.function`` step, the wrapped tape,
``broadcast_variables``), with only the import changed; rank 0 writes OUT (JSON): the largest difference between
its trained weights and Horovod's rule computed in NumPy, and what the collectives returned inside ``tf.function``."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fast_tf.horovod as hvd  # instead of: import horovod.tensorflow as hvd  # noqa: E402

FEATURES, CLASSES, BATCH, STEPS, LR = 6, 3, 8, 6, 0.1


def batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 * rank + step)
    return rng.normal(size=(BATCH, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, BATCH)


def horovod_rule(kernel: np.ndarray, bias: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """SGD on the mean over ranks of each rank's mean cross-entropy gradient, in float64."""
    kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
    for step in range(STEPS):
        d_kernel, d_bias = np.zeros_like(kernel), np.zeros_like(bias)
        for rank in range(size):
            x, y = batch(rank, step)
            logits = x @ kernel + bias
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            p[np.arange(BATCH), y] -= 1.0
            d_kernel += x.T @ p / BATCH / size
            d_bias += p.sum(axis=0) / BATCH / size
        kernel, bias = kernel - LR * d_kernel, bias - LR * d_bias
    return kernel, bias


def restored_adam_fit(folder: str) -> dict:
    """Horovod's restore pattern: rank 0 alone holds a trained Adam state (as loaded from a checkpoint), every rank
    fits with BroadcastGlobalVariablesCallback; the best model is saved by rank 0 alone."""
    tf.keras.utils.set_random_seed(hvd.rank())
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(CLASSES)])
    adam = tf.keras.optimizers.Adam(0.01)
    if hvd.rank() == 0:
        adam.build(model.trainable_variables)
        for variable in adam.variables[1:]:  # the moments (the first is the step count)
            variable.assign(np.full(variable.shape, 0.5, dtype=np.float32))
    model.compile(optimizer=hvd.DistributedOptimizer(adam), loss="sparse_categorical_crossentropy")
    x, y = (np.concatenate(part) for part in zip(*(batch(hvd.rank(), s) for s in range(3)), strict=True))
    best = hvd.callbacks.BestModelCheckpoint(filepath=f"{folder}/best.keras", monitor="loss")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0, average_at_end=False), best]
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    state = np.concatenate([np.ravel(v) for v in [*model.weights, *adam.variables]])[None, :]
    every = hvd.allgather(tf.constant(state)).numpy()
    tracked = best.best is not None and bool(np.isfinite(float(best.best)))  # rank 0's best loss; untouched elsewhere
    return {"restored_equal": bool(np.all(every == every[0])), "best_tracked": tracked}


def compressed_fit() -> dict:
    """hvd.Compression.fp16 on the Keras optimizer: the gradients go as fp16 (half the bytes of the same fit); FAST's
    int8 codec by name: a quarter, and the scales."""
    sent = {}
    for name, compression in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16), ("int8", "int8")):
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(CLASSES)])
        optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LR), compression=compression)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0)
        model.fit(*batch(hvd.rank(), 0), batch_size=BATCH, epochs=4, verbose=0, callbacks=[callback])
        sent[name] = (callback.worker.metrics.bytes_sent, callback.worker.strategy.compress)
    return {
        "compress": [sent[name][1] for name in ("none", "fp16", "int8")],
        "bytes_ratio": sent["fp16"][0] / sent["none"][0],
        "int8_bytes_ratio": sent["int8"][0] / sent["none"][0],
    }


def no_input_fit() -> dict:
    """Horovod's usual model, with no keras.Input: Keras builds it in fit's first step, and the ranks still start
    from rank 0's weights and apply the mean gradient from that first step on."""
    tf.keras.utils.set_random_seed(10 + hvd.rank())
    model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="tanh"), tf.keras.layers.Dense(CLASSES)])
    model.compile(
        optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(LR)), loss="sparse_categorical_crossentropy"
    )
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, average_at_end=False)
    model.fit(*batch(hvd.rank(), 1), batch_size=BATCH, epochs=3, verbose=0, callbacks=[callback])
    state = np.concatenate([np.ravel(v) for v in model.weights])[None, :]
    every = hvd.allgather(tf.constant(state)).numpy()
    return {"no_input_equal": bool(np.all(every == every[0])), "no_input_steps": callback.worker.step}


def calls() -> dict:
    """The rest of Horovod's TensorFlow collectives, eagerly and in a graph."""
    rank, size = hvd.rank(), hvd.size()
    rows = tf.constant(np.arange(5 * 2, dtype=np.float32).reshape(5, 2) * (rank + 1))
    scattered = hvd.reducescatter(rows, op=hvd.Sum)
    in_graph = tf.function(lambda t: hvd.reducescatter(t, op=hvd.Sum))(rows)
    sent = tf.constant([[10 * rank + i] for i in range(3)])  # 3 rows: rank 0 gets 1 of them, rank 1 gets 2
    received, came = hvd.alltoall(sent, splits=[1, 2])
    hvd.barrier()
    grouped = hvd.grouped_allreduce([tf.constant([float(rank)]), tf.constant([2.0 * rank])])
    return {
        "reducescatter": scattered.numpy().tolist(),
        "reducescatter_graph": in_graph.numpy().tolist(),
        "alltoall": received.numpy().ravel().tolist(),
        "alltoall_from": came.numpy().tolist(),
        "grouped": [float(g.numpy()[0]) for g in grouped],
        "queries": [hvd.mpi_built(), hvd.mpi_enabled(), hvd.nccl_built(), hvd.gloo_built(), hvd.gloo_enabled()],
        "size": size,
    }


def main() -> None:
    hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())  # each rank starts elsewhere: the broadcast must fix it
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(CLASSES)])
    optimizer = tf.keras.optimizers.SGD(LR)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def start() -> None:
        hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    start()
    kernel0, bias0 = (v.numpy() for v in model.trainable_variables)
    for step in range(STEPS):
        train_step(*batch(hvd.rank(), step))
    kernel, bias = (v.numpy() for v in model.trainable_variables)
    want_kernel, want_bias = horovod_rule(kernel0, bias0, hvd.size())
    mine = tf.constant([float(hvd.rank() + 1)] * 3)
    in_graph = {
        "allreduce": tf.function(lambda t: hvd.allreduce(t))(mine).numpy().tolist(),
        "sum": tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))(mine).numpy().tolist(),
        "allgather": tf.function(lambda t: hvd.allgather(t))(tf.constant([hvd.rank()])).numpy().tolist(),
        "broadcast": tf.function(lambda t: hvd.broadcast(t, root_rank=1))(mine).numpy().tolist(),
    }
    x, y = batch(hvd.rank(), 0)  # eagerly: a layer kept local keeps this rank's own gradient
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn(y, model(x))
    own = tape.gradient(loss, model.trainable_variables)
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[0])
    kept = partial.gradient(loss, model.trainable_variables)
    averaged = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    same = hvd.allgather(tf.constant(np.concatenate([kernel.ravel(), bias])[None, :])).numpy()
    seen = {**restored_adam_fit(os.path.dirname(sys.argv[1])), **calls(), **compressed_fit(), **no_input_fit()}
    for rank in range(hvd.size()):  # each rank says what it saw, in turn
        if rank == hvd.rank():
            with open(f"{sys.argv[1]}.{rank}", "w") as out:
                json.dump(seen, out)
        hvd.barrier()
    if hvd.rank() == 0:
        result = {
            "error": float(max(np.abs(kernel - want_kernel).max(), np.abs(bias - want_bias).max())),
            "ranks_equal": bool(np.all(same == same[0])),
            "moved": float(np.abs(kernel - kernel0).max()),
            "partial_is_own": all(np.array_equal(a, b) for a, b in zip(kept, own, strict=True)),
            "full_is_not_own": not np.allclose(averaged[0], own[0]),
            **in_graph,
        }
        with open(sys.argv[1], "w") as out:
            json.dump(result, out)


if __name__ == "__main__":
    main()
