"""A Keras training script written for Horovod (its API only), run by tests with fast_tf.horovod.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py tests/tf_adapter/horovod_keras_script.py OUT.npz

Softmax regression on 256 of scikit-learn's digits, each rank a slice, plain SGD with Horovod's three callbacks
(broadcast of rank 0's variables, metric averaging, a learning-rate warm-up over 2 of 3 epochs). Rank 0 writes its
start and final weights, the learning rate of every batch and both ranks' histories to OUT.npz;
tests/tf_adapter/test_horovod_keras.py checks them against Horovod's rule computed in NumPy. The collectives are
checked against NumPy on the way (an assertion ends the job with a nonzero status).
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np
from sklearn.datasets import load_digits

import fast_tf.horovod as hvd  # the one line that differs from a Horovod script

BATCH, EPOCHS, WARMUP, LR = 32, 3, 2, 0.2


class LearningRates(keras.callbacks.Callback):
    """The learning rate each batch trains with (read at its start, after the warm-up callback set it)."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def check_collectives(rank: int, size: int) -> None:
    mine = np.arange(6, dtype=np.float32).reshape(2, 3) * (rank + 1)
    base, ranks = np.arange(6.0).reshape(2, 3), np.arange(1, size + 1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(hvd.allreduce(mine)), base * ranks.mean(), rtol=1e-6)
    total = hvd.allreduce(mine, op=hvd.Sum, postscale_factor=2.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(total), base * ranks.sum() * 2, rtol=1e-6)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(hvd.allreduce(mine, op=hvd.Max)), base * size)
    rows = hvd.allgather(np.full((rank + 1, 2), rank, dtype=np.int32))  # ranks send different row counts
    expected = np.concatenate([np.full((r + 1, 2), r, dtype=np.int32) for r in range(size)])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(rows), expected)
    assert float(hvd.broadcast(np.float32(rank + 0.5), root_rank=size - 1)) == size - 0.5
    assert hvd.broadcast_object({"rank": rank}, root_rank=1) == {"rank": 1}


def main(out: str) -> None:
    hvd.init()
    check_collectives(hvd.rank(), hvd.size())
    digits = load_digits()
    x = (digits.data[:256] / 16.0).astype("float32")[hvd.rank() :: hvd.size()]
    y = digits.target[:256][hvd.rank() :: hvd.size()]
    keras.utils.set_random_seed(hvd.rank())  # each rank starts elsewhere: the broadcast callback fixes it
    model = keras.Sequential([keras.Input(shape=(64,)), keras.layers.Dense(10, activation="softmax")])
    start = [w.copy() for w in model.get_weights()]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    rates = LearningRates()
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=WARMUP),
        rates,
    ]
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, callbacks=callbacks, verbose=0)
    histories = hvd.allgather_object({k: [float(v) for v in vs] for k, vs in history.history.items()})
    if hvd.rank() == 0:
        kernel, bias = model.get_weights()
        np.savez(
            out,
            start_kernel=start[0],
            start_bias=start[1],
            kernel=kernel,
            bias=bias,
            rates=np.array(rates.rates),
            histories=np.array(json.dumps(histories)),
        )


if __name__ == "__main__":
    main(sys.argv[1])
