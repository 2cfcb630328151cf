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
