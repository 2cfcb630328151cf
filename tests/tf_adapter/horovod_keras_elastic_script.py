"""Horovod's TF2 Keras elastic example in shape (examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py:
one fit step to build the model and optimizer, ``KerasState(model, batch=0, epoch=0)``, the three elastic callbacks,
``@hvd.elastic.run`` around ``fit``) on the digits, with FAST's import, plus the callback that runs FAST's strategy
(Horovod's own elastic example leaves it out: its sync replaces it):

    fast run [--fault-tolerant [--max-restarts K]] -n 2 tests/tf_adapter/horovod_keras_elastic_script.py

Each rank prints one JSON line: its rank, the epochs trained, the test accuracy and the sum of its weights.
"""

from __future__ import annotations

import json

import keras
import numpy as np

import fast_tf.horovod as hvd  # instead of: import horovod.tensorflow.keras as hvd
from fast_core.data.datasets import example_task

EPOCHS, BATCH, LR = 4, 32, 0.05

hvd.init()
task = example_task("digits")
(x_train, y_train), (x_test, y_test) = task.train, task.test
x_mine, y_mine = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]

keras.utils.set_random_seed(hvd.rank())  # rank 0's start reaches every rank at the first sync
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
model.compile(
    optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR * hvd.size(), momentum=0.9)),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
)
model.fit(x_mine[:BATCH], y_mine[:BATCH], batch_size=BATCH, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])  # fmt: skip

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset() -> None:
    model.optimizer.learning_rate = LR * hvd.size()


state.register_reset_callbacks([on_state_reset])
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
]


@hvd.elastic.run
def train(state: hvd.elastic.KerasState) -> None:
    state.model.fit(x_mine, y_mine, batch_size=BATCH, epochs=EPOCHS - state.epoch, callbacks=callbacks, verbose=0)


train(state)
accuracy = float(np.mean(np.argmax(model.predict(x_test, verbose=0), axis=1) == y_test))
total = float(sum(np.sum(np.asarray(w, dtype=np.float64)) for w in model.get_weights()))
print(json.dumps({"rank": hvd.rank(), "epochs": state.epoch, "accuracy": accuracy, "params": total}), flush=True)
