"""``fast_tf.horovod.elastic``: ``KerasState`` (``TensorFlowKerasState``) commits, restores and syncs a Keras model's
and optimizer's variables against expected values, in one process; and Horovod's TF2 Keras elastic example in shape
(one fit step, ``KerasState``, the three elastic callbacks, ``@hvd.elastic.run`` around ``fit``) trains under
`fast run -n 2`."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
from fast_cli import check_elastic_example

import fast_tf.horovod as hvd
from fast_core import LocalCluster

HERE = Path(__file__).resolve().parent


def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    return model


def _step(model: keras.Model) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    model.train_on_batch(x, np.ones((2, 3), np.float32))


def _weights(model: keras.Model) -> list[np.ndarray]:
    return [np.array(w) for w in model.get_weights()]


def _slots(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.optimizer.variables]


def test_commit_and_restore_bring_back_the_weights_the_optimizer_and_the_values() -> None:
    model = _model(0)
    _step(model)
    state = hvd.elastic.KerasState(model, fast_engine=LocalCluster(1).engine(0), epoch=1)
    weights, slots = _weights(model), _slots(model)
    _step(model)
    state.epoch = 2
    assert not np.allclose(_weights(model)[0], weights[0])
    state.restore()
    for mine, committed in zip(_weights(model) + _slots(model), weights + slots, strict=True):
        np.testing.assert_array_equal(mine, committed)
    assert state.epoch == 1 and state.optimizer is model.optimizer


def test_an_unbuilt_model_is_refused_as_horovod_does() -> None:
    with pytest.raises(ValueError, match="Model must be built first"):
        hvd.elastic.TensorFlowKerasState(keras.Sequential([keras.layers.Dense(3)]))


def _sync(engine):
    model = _model(engine.rank)
    if engine.rank == 0:  # rank 0 took a step (momentum); rank 1's optimizer has no variables yet
        _step(model)
    state = hvd.elastic.KerasState(model, fast_engine=engine, epoch=engine.rank)
    state.sync()
    return _weights(model), _slots(model), state.epoch


def test_sync_gives_every_rank_rank_0s_variables_even_to_an_optimizer_that_took_no_step() -> None:
    (weights0, slots0, epoch0), (weights1, slots1, epoch1) = LocalCluster(2, timeout=60).run(_sync)
    assert len(slots0) == len(slots1) and (epoch0, epoch1) == (0, 0)
    for mine, theirs in zip(weights0 + slots0, weights1 + slots1, strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_horovods_keras_elastic_example_shape_trains_under_fast_run(tmp_path: Path) -> None:
    check_elastic_example(HERE / "horovod_keras_elastic_script.py", tmp_path / "run", epochs=4)
