"""For shards that are not identically distributed: gradient tracking (``tracking:ring``, DIGing in
adapt-then-combine form) and D-PSGD's quasi-global momentum (``dpsgd:ring,qgm=0.9``) against their NumPy rules; on
shards split by label (``shard_by_label``) they keep every worker's model near all-reduce's where D-PSGD's, and
D-PSGD's with local momentum, drift apart."""

from __future__ import annotations

import numpy as np
import pytest
from cases_compose import simulate
from training import BATCH, CLASSES, FEATURES, LR, task, train

from fast_core import LocalCluster, Worker, make_strategy
from fast_core.data.sharding import shard_by_label
from fast_core.errors import ConfigError
from fast_core.model.numpy_model import SGD, Momentum, SoftmaxRegression
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


def reference_qgm(size: int, steps: int, beta: float) -> np.ndarray:
    """X <- W X - lr G - beta M; M <- beta M + (1 - beta)(X_old - X_new), from M = 0 (D-PSGD's form)."""
    w = make_topology("ring", size).mixing_matrix(0)
    kept: dict[str, np.ndarray] = {}

    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        momentum = kept.get("momentum", np.zeros_like(states))
        new = w @ states - LR * grads - beta * momentum
        kept["momentum"] = beta * momentum + (1 - beta) * (states - new)
        return new

    return simulate(size, steps, rule)[-1]


def test_quasi_global_momentum_follows_its_rule() -> None:
    got = LocalCluster(4, timeout=30).run(lambda engine: train(engine, "dpsgd:ring,qgm=0.8", STEPS)[0].params())
    expected = reference_qgm(4, STEPS, 0.8)
    assert np.isfinite(expected).all()
    for rank, params in enumerate(got):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-9, atol=1e-12)
    with pytest.raises(ConfigError, match=r"qgm \(quasi-global momentum\) must be in \[0, 1\), got 1"):
        make_strategy("dpsgd:ring,qgm=1")


def _train_on_label_shards(engine, strategy: str, steps: int = 150, lr: float = 0.5, momentum: bool = False) -> float:
    x, y, _, (x_test, y_test) = task(engine.size)
    mine = shard_by_label(y[:2000], engine.rank, engine.size)
    optimizer = Momentum(lr, beta=0.9) if momentum else SGD(lr)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=optimizer, seed=0)
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


def test_on_shards_split_by_label_quasi_global_momentum_keeps_what_local_momentum_loses() -> None:
    def worst(strategy: str, momentum: bool) -> float:
        return min(LocalCluster(8, timeout=60).run(_train_on_label_shards, strategy, lr=0.05, momentum=momentum))

    allreduce, local, quasi = worst("allreduce", True), worst("dpsgd:ring", True), worst("dpsgd:ring,qgm=0.9", False)
    assert quasi >= allreduce - 0.015, (quasi, allreduce)
    assert local <= quasi - 0.01, (local, quasi)  # measured 0.932 (local momentum), 0.958 (QGM), 0.958 (all-reduce)


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
