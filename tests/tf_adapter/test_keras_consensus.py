"""fast_tf.consensus_weights and consensus_model: the consensus model mid-training, averaged exactly (NumPy
reference), with this rank's model left as it is; in-process on a LocalCluster with the TensorFlow backend."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras_cases import LR, fit, rank_data

import fast_tf as fast
from fast_core import Engine, LocalCluster

SIZE = 3


def _rank(engine: Engine) -> dict[str, list[np.ndarray]]:
    model, _ = fit(engine, "async:ring", keras.optimizers.SGD(LR))  # average_at_end=False: each rank's own model
    own = [w.copy() for w in model.get_weights()]
    consensus = fast.consensus_weights(model, engine)
    return {"own": own, "consensus": consensus, "after": model.get_weights()}


def test_consensus_weights_are_the_mean_over_ranks_and_leave_the_model_as_it_is() -> None:
    results = LocalCluster(SIZE, timeout=180).run(_rank)
    for result in results:
        for index, own in enumerate(result["own"]):
            stack = np.stack([other["own"][index].astype(np.float64) for other in results])
            expected = (stack.sum(axis=0) / SIZE).astype(own.dtype)  # float64 sums of 3 float32: exact
            np.testing.assert_array_equal(result["consensus"][index], expected)
            np.testing.assert_array_equal(result["after"][index], own)
    assert not np.array_equal(results[0]["own"][0], results[1]["own"][0])  # the ranks differed: a real average


def _consensus_model(engine: Engine) -> dict[str, object]:
    optimizer = fast.DistributedOptimizer(keras.optimizers.SGD(LR))
    model, _ = fit(engine, "dpsgd:ring", optimizer)  # average_at_end=False: the ranks differ
    own = [w.copy() for w in model.get_weights()]
    copy = fast.consensus_model(model, engine)
    x, y = rank_data(0)
    return {
        "own": own,
        "copy": copy.get_weights(),
        "after": model.get_weights(),
        "predict": copy.predict(x, verbose=0),
        "loss": copy.evaluate(x, y, verbose=0),
        "separate": copy is not model and copy.optimizer is not model.optimizer,
    }


def test_consensus_model_is_a_copy_holding_the_mean_that_predicts_and_evaluates() -> None:
    results = LocalCluster(4, timeout=180).run(_consensus_model)
    mean = [
        (np.stack([r["own"][i].astype(np.float64) for r in results]).sum(axis=0) / 4).astype(np.float32)
        for i in range(len(results[0]["own"]))
    ]
    x, y = rank_data(0)
    logits = x.astype(np.float64) @ mean[0] + mean[1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    loss = np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y])  # softmax cross-entropy
    for result in results:
        for index, own in enumerate(result["own"]):
            np.testing.assert_array_equal(result["copy"][index], mean[index])
            np.testing.assert_array_equal(result["after"][index], own)
        np.testing.assert_allclose(result["predict"], logits, rtol=0, atol=1e-5)
        assert abs(result["loss"] - loss) < 1e-5, (result["loss"], loss)
        assert result["separate"]
    assert not np.array_equal(results[0]["own"][0], results[1]["own"][0])  # the ranks differed: a real average


def test_consensus_model_names_what_to_do_for_a_model_it_cannot_clone() -> None:
    class Unclonable(keras.Model):
        def __init__(self) -> None:  # no **kwargs: from_config cannot rebuild it
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Unclonable()
    model(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(TypeError, match=r"cannot clone this Unclonable.*consensus_weights\(model\)"):
        fast.consensus_model(model, LocalCluster(1).engine(0))
