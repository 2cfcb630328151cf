"""fast_tf.consensus_weights: the consensus model's weights mid-training, averaged exactly (NumPy reference), with
this rank's model left as it is; in-process on a LocalCluster with the TensorFlow backend."""

from __future__ import annotations

import keras
import numpy as np
from keras_cases import LR, fit

import fast_tf as fast
from fast_core import Engine, LocalCluster

SIZE = 3


def _rank(engine: Engine) -> dict[str, list[np.ndarray]]:
    model, _ = fit(engine, "async:ring", keras.optimizers.SGD(LR))  # average_at_end=False: each rank's own model
    own = [w.copy() for w in model.get_weights()]
    consensus = fast.consensus_weights(model, engine)
    return {"own": own, "consensus": consensus, "after": model.get_weights()}


def test_consensus_weights_are_the_mean_over_ranks_and_leave_the_model_as_it_is() -> None:
    results = LocalCluster(SIZE, timeout=60).run(_rank)
    for result in results:
        for index, own in enumerate(result["own"]):
            stack = np.stack([other["own"][index].astype(np.float64) for other in results])
            expected = (stack.sum(axis=0) / SIZE).astype(own.dtype)  # float64 sums of 3 float32: exact
            np.testing.assert_array_equal(result["consensus"][index], expected)
            np.testing.assert_array_equal(result["after"][index], own)
    assert not np.array_equal(results[0]["own"][0], results[1]["own"][0])  # the ranks differed: a real average
