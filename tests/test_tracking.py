"""Gradient tracking (``tracking:ring``, DIGing in adapt-then-combine form) against its NumPy rule; on shards split
by label it keeps every worker's model near all-reduce's where D-PSGD's drift apart; shard_by_label's shards."""

from __future__ import annotations

import numpy as np
import pytest
from cases_compose import simulate
from training import BATCH, CLASSES, FEATURES, LR, task, train

from fast_core import LocalCluster, Worker
from fast_core.numpy_model import SGD, SoftmaxRegression
from fast_core.sharding import shard_by_label
from fast_core.topology import make_topology

STEPS = 30


def reference_tracking(size: int, topology: str, steps: int) -> np.ndarray:
    """Y <- W(k) (Y + G - G_prev); X <- W(k) (X - lr Y), from Y = G_prev = 0."""
    graph = make_topology(topology, size)
    kept: dict[str, np.ndarray] = {}

    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        w = graph.mixing_matrix(step)
        tracker = kept.get("tracker", np.zeros_like(grads)) + grads - kept.get("previous", np.zeros_like(grads))
        kept["tracker"], kept["previous"] = w @ tracker, grads
        return w @ (states - LR * kept["tracker"])

    return simulate(size, steps, rule)[-1]


@pytest.mark.parametrize("topology", ["ring", "exp1"])
def test_tracking_follows_its_rule(topology: str) -> None:
    got = LocalCluster(4, timeout=30).run(lambda engine: train(engine, f"tracking:{topology}", STEPS)[0].params())
    expected = reference_tracking(4, topology, STEPS)
    assert np.isfinite(expected).all()
    for rank, params in enumerate(got):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-9, atol=1e-12)


def _train_on_label_shards(engine, strategy: str, steps: int = 150, lr: float = 0.5) -> float:
    x, y, _, (x_test, y_test) = task(engine.size)
    mine = shard_by_label(y[:2000], engine.rank, engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(lr), seed=0)
    worker = Worker(model, strategy, engine).start()
    for step in range(steps):
        start = (step * BATCH) % (len(mine) - BATCH)
        index = mine[start : start + BATCH]
        model.compute_gradients(x[index], y[index])
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    return model.accuracy(x_test, y_test)


def test_on_shards_split_by_label_tracking_keeps_each_model_where_dpsgd_drifts() -> None:
    worst = {
        strategy: min(LocalCluster(8, timeout=60).run(_train_on_label_shards, strategy))
        for strategy in ("allreduce", "dpsgd:ring", "tracking:ring")
    }
    assert worst["tracking:ring"] >= worst["allreduce"] - 0.015, worst
    assert worst["dpsgd:ring"] <= worst["tracking:ring"] - 0.01, worst  # measured 0.927 vs 0.95 (allreduce 0.958)


def test_shards_split_by_label_see_few_classes_and_have_one_length() -> None:
    labels = np.repeat(np.arange(10), 50)[np.random.default_rng(0).permutation(500)]
    shards = [shard_by_label(labels, rank, 4) for rank in range(4)]
    assert {len(s) for s in shards} == {125}
    assert sorted(np.concatenate(shards).tolist()) == list(range(500))
    assert all(len(np.unique(labels[s])) <= 4 for s in shards)  # 2.5 classes per rank on average
    assert not np.array_equal(shard_by_label(labels, 1, 4, epoch=1), shards[1])  # reshuffled per epoch
    assert set(shard_by_label(labels, 1, 4, epoch=1)) == set(shards[1])
    with pytest.raises(ValueError, match="rank 4 is outside 0..3"):
        shard_by_label(labels, 4, 4)
