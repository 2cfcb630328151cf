"""The parameter server ``ps`` (fast_core/strategies/ps.py, ps_async.py) against NumPy references, on 4 ranks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from training import BATCH, CLASSES, FEATURES, LR, batch, reference_mean_gradient, task, train

from fast_core import LocalCluster, Worker, make_strategy
from fast_core.errors import ConfigError
from fast_core.model.numpy_model import SGD, Momentum, SoftmaxRegression
from fast_core.strategies import AsyncPS, SyncPS
from fast_core.strategies.canonical import canonical_strategy
from fast_core.strategies.ps import shard_bounds

STEPS = 12
PARAMS = (FEATURES + 1) * CLASSES  # the softmax model's flat size
ITEM = 8  # float64


def final_params(strategy: str, size: int = 4, optimizer=None) -> list[np.ndarray]:
    def body(engine):
        model, _ = train(engine, make_strategy(strategy), STEPS, optimizer=optimizer and optimizer())
        return model.params().copy()

    return LocalCluster(size, timeout=30).run(body)


def test_sync_ps_is_allreduce_sgd() -> None:
    expected = reference_mean_gradient(4, STEPS)
    ps = final_params("ps:servers=2")
    allreduce = final_params("allreduce")
    for mine, theirs in zip(ps, allreduce, strict=True):
        np.testing.assert_allclose(mine, expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)
    assert np.abs(expected - SoftmaxRegression(FEATURES, CLASSES, seed=0).params()).max() > 1e-3  # it moved


def test_sync_ps_keeps_the_users_optimizer() -> None:
    """With momentum, every worker's own optimizer applies the servers' mean gradient: still all-reduce's run."""
    ps = final_params("ps:servers=3", optimizer=lambda: Momentum(LR, 0.9))
    allreduce = final_params("allreduce", optimizer=lambda: Momentum(LR, 0.9))
    for mine, theirs in zip(ps, allreduce, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)


def test_sync_scale_multiplies_the_sum_of_the_gradients() -> None:
    """scale=0.5 on 4 ranks applies 0.5 * sum = 2 * mean: all-reduce SGD at twice the learning rate."""
    expected = reference_mean_gradient(4, STEPS, optimizer=SGD(2 * LR))
    for mine in final_params("ps:servers=2,scale=0.5"):
        np.testing.assert_allclose(mine, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_sync_ps_keeps_every_replica_equal(codec: str) -> None:
    """Every worker, the servers' own included, applies the decoded mean gradient: the replicas stay identical."""
    ps = final_params(f"ps:servers=2,compress={codec}")
    for mine in ps[1:]:
        np.testing.assert_array_equal(mine, ps[0])
    np.testing.assert_allclose(ps[0], reference_mean_gradient(4, STEPS), rtol=0, atol=5e-3)  # it moved by 0.38


def traffic(strategy: str, steps: int, size: int = 4) -> list[tuple[int, int]]:
    """(bytes sent, bytes received) of each rank over ``steps`` steps, start-up traffic left out."""

    def body(engine):
        x, y, shards, _ = task(size)
        model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
        worker = Worker(model, make_strategy(strategy), engine).start()
        start = (worker.metrics.bytes_sent, worker.metrics.bytes_received)
        engine.barrier()  # no rank asks before every rank has read its counters
        for step in range(steps):
            model.compute_gradients(*batch(x, y, shards[engine.rank], step))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        worker.close()
        return worker.metrics.bytes_sent - start[0], worker.metrics.bytes_received - start[1]

    return LocalCluster(size, timeout=30).run(body)


def test_sync_bytes_per_step_a_worker_sends_one_gradient_a_server_carries_its_shard_n_times() -> None:
    shards = [hi - lo for lo, hi in shard_bounds(PARAMS, 2)]
    steps = 3
    for rank, (sent, received) in enumerate(traffic("ps:servers=2", steps)):
        own = shards[rank] if rank < 2 else 0
        # every shard but its own goes to its server; its own shard's average goes to the 3 others
        expected = (PARAMS - own) + 3 * own
        assert sent == received == steps * expected * ITEM, (rank, sent, received)


def test_async_bytes_per_step_are_one_padded_shard_and_a_step_count_per_other_server() -> None:
    width = max(hi - lo for lo, hi in shard_bounds(PARAMS, 2)) + 1  # and the step count
    steps = 5
    for rank, (sent, received) in enumerate(traffic("ps:servers=2,mode=async", steps)):
        asks = 2 - (rank < 2)  # servers it talks to over the wire; its own shard it updates in place
        answers = 3 if rank < 2 else 0  # requests its service answers: one per other rank and step
        assert sent == received == steps * (asks + answers) * width * ITEM, (rank, sent, received)


def test_async_follows_the_downpour_rule_in_a_fixed_interleaving() -> None:
    """Downpour as published (scale=1). Two ranks, one server (rank 0): rank 1 runs its steps first, then rank 0
    (which computed its first gradient at the start, before rank 1's updates): a sequential NumPy run of the same
    rule gives the same numbers."""
    x, y, shards, _ = task(2)
    first, second = 3, 4
    turn = threading.Event()

    def body(engine):
        model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
        worker = Worker(model, make_strategy("ps:servers=1,mode=async,scale=1"), engine).start()
        if engine.rank == 0:
            model.compute_gradients(*batch(x, y, shards[0], 0))  # at the start: stale once rank 1 has pushed
            turn.wait(30)
            for step in range(second):
                if step:
                    model.compute_gradients(*batch(x, y, shards[0], step))
                worker.before_step()
                model.optimizer_step()
                worker.after_step()
        else:
            for step in range(first):
                model.compute_gradients(*batch(x, y, shards[1], step))
                worker.before_step()
                model.optimizer_step()
                worker.after_step()
            turn.set()
        worker.close()
        return model.params().copy()

    results = LocalCluster(2, timeout=30).run(body)
    ref = SoftmaxRegression(FEATURES, CLASSES, seed=0)
    w = ref.params().copy()

    def gradient(at: np.ndarray, rank: int, step: int) -> np.ndarray:
        ref.set_params(at)
        ref.compute_gradients(*batch(x, y, shards[rank], step))
        return ref.grads().copy()

    stale = gradient(w, 0, 0)
    for step in range(first):  # rank 1 alone: its pull is the server's w, which only it moved
        w = w - LR * gradient(w, 1, step)
    np.testing.assert_allclose(results[1], w, rtol=0, atol=1e-12)
    w = w - LR * stale
    for step in range(1, second):
        w = w - LR * gradient(w, 0, step)
    np.testing.assert_allclose(results[0], w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("staleness", [0, 2, None])
def test_staleness_holds_fast_workers_within_s_steps_of_the_slowest(staleness: int | None) -> None:
    """Rank 3 computes 10 times as long: with staleness=s no worker ever ends a step more than s (+ 1, what the
    test's own view of the slow rank lags) steps ahead of it; without a bound they run far ahead."""
    x, y, shards, _ = task(4)
    done = [0] * 4
    gaps = [0] * 4
    spec = "ps:servers=2,mode=async" + ("" if staleness is None else f",staleness={staleness}")

    def body(engine):
        model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
        worker = Worker(model, make_strategy(spec), engine).start()
        for step in range(15):
            model.compute_gradients(*batch(x, y, shards[engine.rank], step))
            time.sleep(0.02 if engine.rank == 3 else 0.002)
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            done[engine.rank] = step + 1
            gaps[engine.rank] = max(gaps[engine.rank], step + 1 - min(done))
        worker.close()
        return worker.metrics.wait_seconds

    waits = LocalCluster(4, timeout=30).run(body)
    if staleness is None:
        assert max(gaps) >= 8, gaps
    else:
        assert max(gaps) <= staleness + 1, gaps
        assert min(waits[:3]) > 0.05, waits  # the fast ranks did wait


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ps_trains_digits_on_four_ranks(mode: str) -> None:
    from fast_core.data.datasets import digits, shard_indices

    data, labels = digits()
    test = slice(1500, None)

    def body(engine):
        model = SoftmaxRegression(data.shape[1], 10, optimizer=SGD(0.5), seed=engine.rank)
        worker = Worker(model, make_strategy(f"ps:servers=2,mode={mode}"), engine).start()
        shard = shard_indices(1500, engine.rank, engine.size, seed=0)
        for step in range(150):
            idx = shard[(step * BATCH) % (len(shard) - BATCH) :][:BATCH]
            model.compute_gradients(data[idx], labels[idx])
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        worker.close()
        return model.accuracy(data[test], labels[test], params=worker.group.average_params())

    accuracies = LocalCluster(4, timeout=30).run(body)
    assert min(accuracies) > 0.85, accuracies


def test_the_options_are_read_back() -> None:
    assert type(make_strategy("ps")) is SyncPS and type(make_strategy("ps:mode=async")) is AsyncPS
    for spec in (
        "ps:servers=2,mode=async,scale=1,staleness=none,compress=int8",
        "ps:servers=none,mode=sync,scale=none,staleness=none,compress=none",
        "ps:servers=1,mode=async,scale=none,staleness=3,compress=none",
    ):
        assert canonical_strategy(make_strategy(spec)) == spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ps:servers=0", "ps servers must be a whole number >= 1, got 0; e.g. ps:servers=2"),
        ("ps:servers=1.5", "ps servers must be a whole number >= 1, got 1.5"),
        ("ps:mode=async,scale=0", "ps scale must be a number > 0 \\(none: 1/N\\), got 0"),
        ("ps:staleness=1", "ps staleness bounds the asynchronous mode; use ps:mode=async,staleness=S"),
        ("ps:mode=async,staleness=-1", "ps staleness must be a whole number of steps >= 0"),
        ("ps:mode=async,staleness=1,compress=fp16", "ps staleness cannot travel compressed"),
        ("ps:mode=downpour", "ps mode must be 'sync' or 'async', got 'downpour'"),
        ("ps:compress=topk", "ps cannot send its vectors as topk"),
    ],
)
def test_bad_options_are_named(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_strategy(spec)


def test_a_variant_refuses_the_other_mode() -> None:
    with pytest.raises(ConfigError, match="AsyncPS runs mode=async, got mode='sync'"):
        AsyncPS(mode="sync")


def test_more_servers_than_ranks_is_refused_with_the_fix() -> None:
    def body(engine):
        model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
        Worker(model, make_strategy("ps:servers=3"), engine).start()

    with pytest.raises(ConfigError, match=r"ps:servers=3 needs at least 3 ranks .* use ps:servers=1"):
        LocalCluster(2, timeout=10).run(body)


def test_default_servers_are_half_the_ranks() -> None:
    def body(engine):
        strategy = make_strategy("ps")
        Worker(SoftmaxRegression(FEATURES, CLASSES, seed=0), strategy, engine).start().close()
        return len(strategy._bounds)

    assert LocalCluster(4, timeout=10).run(body) == [2, 2, 2, 2]
