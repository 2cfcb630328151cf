"""fast_tf.save_checkpoint and Callback(resume_from=...) on in-process clusters (TensorFlow backend): saved on 4
ranks, resumed on 2 and 8 with the consensus model, the ranks' average of the optimizer's variables (SGD momentum,
Adam moments, the learning rate) and of BatchNorm's statistics, FAST's step; under async averaging a resumed model
is not pulled back toward the new model's start; a file of another optimizer or a call before fit is refused.
The JAX and torch Keras backends run the same round trip under mpiexec (keras_cases.case_checkpoint_round_trip)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras_cases import BATCH, CLASSES, FEATURES, rank_data

import fast_tf as fast
from fast_core import LocalCluster
from fast_core.runtime.checkpoint import CheckpointError

OPTIMIZERS = {
    "sgd-momentum": lambda lr=0.05: keras.optimizers.SGD(lr, momentum=0.9),
    "adam": lambda lr=0.01: keras.optimizers.Adam(lr, beta_1=0.8),
}


def make_model(seed: int, optimizer: keras.optimizers.Optimizer) -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = [keras.layers.Dense(5), keras.layers.BatchNormalization(), keras.layers.Dense(CLASSES)]
    model = keras.Sequential([keras.Input((FEATURES,)), *layers])
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Probe(keras.callbacks.Callback):
    """What the model holds when training begins, after fast_tf.Callback (placed before it) has resumed."""

    def __init__(self, callback: fast.Callback) -> None:
        super().__init__()
        self.callback = callback
        self.seen: dict = {}

    def on_train_begin(self, logs=None) -> None:
        model = self.model
        self.seen = {
            "params": flat(model.trainable_variables),
            "optimizer": [v.numpy().copy() for v in model.optimizer.variables],
            "buffers": flat(model.non_trainable_variables),
            "step": self.callback.worker.step,
        }


def flat(variables) -> np.ndarray:
    return np.concatenate([np.asarray(v.numpy(), dtype=np.float64).reshape(-1) for v in variables])


def _save(engine, path: str, kind: str):
    model = make_model(engine.rank, OPTIMIZERS[kind]())
    callback = fast.Callback("dpsgd:ring", engine=engine, average_at_end=False)
    x, y = rank_data(engine.rank)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    fast.save_checkpoint(path, callback)
    optimizer = [v.numpy().copy() for v in model.optimizer.variables]
    return flat(model.trainable_variables), optimizer, flat(model.non_trainable_variables), callback.worker.step


def _resume(engine, path: str, kind: str):
    model = make_model(100 + engine.rank, OPTIMIZERS[kind](lr=0.5))
    callback = fast.Callback("dpsgd:ring", engine=engine, average_at_end=False, resume_from=path)
    probe = Probe(callback)
    x, y = rank_data(engine.rank)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback, probe])
    assert callback.resume_from is None  # a second fit goes on from where this one ended
    return probe.seen, callback.worker.step


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_saved_on_four_ranks_it_resumes_on_two_and_eight_with_the_optimizer_state(tmp_path, kind: str) -> None:
    path = str(tmp_path / "keras.ckpt")
    saved = LocalCluster(4, timeout=180).run(_save, path, kind)  # the first fit traces 4 models at once: patience
    assert not np.allclose(saved[0][0], saved[1][0])  # the replicas differ: the checkpoint holds their mean
    mean = np.mean([s[0] for s in saved], axis=0)
    mean_optimizer = [np.mean([s[1][i] for s in saved], axis=0) for i in range(len(saved[0][1]))]
    mean_buffers = np.mean([s[2] for s in saved], axis=0)
    steps = saved[0][3]
    for size in (2, 8):  # eight Keras fits in threads of one process on two cores: a patient timeout
        for seen, step_after in LocalCluster(size, timeout=180).run(_resume, path, kind):
            np.testing.assert_allclose(seen["params"], mean, rtol=1e-6, atol=1e-7)
            assert len(seen["optimizer"]) == len(mean_optimizer)
            for got, want in zip(seen["optimizer"], mean_optimizer, strict=True):
                np.testing.assert_allclose(got, want.astype(got.dtype), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(seen["buffers"], mean_buffers, rtol=1e-6, atol=1e-7)
            assert seen["step"] == steps and step_after == steps + len(rank_data(0)[0]) // BATCH


def _ones(engine, path: str) -> None:
    model = make_model(0, keras.optimizers.SGD(0.0))
    callback = fast.Callback("dpsgd:ring", engine=engine)
    x, y = rank_data(engine.rank)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[callback])
    for variable in model.trainable_variables:
        variable.assign(np.ones(variable.shape, dtype="float32"))
    fast.save_checkpoint(path, callback)


def _async_lr0(engine, path: str, strategy: str) -> np.ndarray:
    model = make_model(7 + engine.rank, keras.optimizers.SGD(0.3))  # the saved learning rate, 0, is restored
    callback = fast.Callback(strategy, engine=engine, average_at_end=False, resume_from=path)
    x, y = rank_data(engine.rank)
    model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[callback])
    return flat(model.trainable_variables)


@pytest.mark.parametrize("strategy", ["async:ring", "async:ring,keep_progress=false"])
def test_a_resumed_model_under_async_is_not_pulled_to_the_new_start(tmp_path, strategy: str) -> None:
    path = str(tmp_path / "ones.ckpt")
    LocalCluster(2, timeout=180).run(_ones, path)
    for params in LocalCluster(4, timeout=180).run(_async_lr0, path, strategy):
        np.testing.assert_allclose(params, 1.0, rtol=0, atol=1e-6)


def _other_optimizer(engine, path: str) -> None:
    model = make_model(engine.rank, keras.optimizers.Adam(0.01))
    callback = fast.Callback("dpsgd:ring", engine=engine, resume_from=path)
    x, y = rank_data(engine.rank)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[callback])


def test_a_checkpoint_of_another_optimizer_is_refused_on_every_rank(tmp_path) -> None:
    path = str(tmp_path / "sgd.ckpt")
    LocalCluster(2, timeout=180).run(_save, path, "sgd-momentum")
    with pytest.raises(CheckpointError, match=r"state of SGD with \d+ variables, this model's optimizer is Adam"):
        LocalCluster(2, timeout=180).run(_other_optimizer, path)


def test_saving_before_any_fit_says_what_to_pass(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="needs the fast_tf.Callback of a fit that has begun"):
        fast.save_checkpoint(str(tmp_path / "x.ckpt"), fast.Callback("dpsgd:ring"))


def test_a_missing_checkpoint_is_one_clear_error(tmp_path) -> None:
    def resume(engine) -> None:
        _resume(engine, str(tmp_path / "absent.ckpt"), "adam")

    with pytest.raises(CheckpointError, match="absent.ckpt"):
        LocalCluster(2, timeout=180).run(resume)
