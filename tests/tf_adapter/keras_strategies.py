"""Every strategy through fast_tf.Callback on the Keras example's CNN, in one mpiexec launch (Keras imports once).

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/tf_adapter/keras_strategies.py [--epochs E] [strategy ...]

Trains the digits model of examples/keras_digits.py once per strategy (8 epochs, batch 32, lr 0.1) on the Keras
backend KERAS_BACKEND names and compares it with all-reduce (tests/strategy_comparison.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras

import fast_tf as fast
from fast_examples import keras_digits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared comparison
from strategy_comparison import run_comparison  # noqa: E402


def train(strategy: str, epochs: int) -> float:
    return keras_digits.train(strategy, "digits", epochs, batch_size=32, lr=0.1, verbose=False)


if __name__ == "__main__":
    engine = fast.init()
    run_comparison(train, engine, 8, header=f"Keras {keras.backend.backend()} backend, {engine.size} ranks")
