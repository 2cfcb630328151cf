"""Multi-rank cases of Stochastic Gradient Push (collected by cases.py).

Push-sum's point is the true average on graphs where plain averaging is biased, so the cases check exactly that
against dense NumPy iterations: W (row stochastic, what D-PSGD does) and P (column stochastic, what SGP does).
"""

from __future__ import annotations

import numpy as np
from training import CLASSES, FEATURES, LR, batch, task, train

from fast_core import Worker
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies.sgp import SGP
from fast_core.topology import Topology, from_edges, is_column_stochastic, is_doubly_stochastic, make_topology


def directed_ring_with_chord(size: int) -> Topology:
    """0 -> 1 -> ... -> N-1 -> 0 plus the one-way chord 0 -> 2: in-degrees differ, so uniform W is biased.

    Below 3 ranks there is no room for a chord: the ring of 2 is undirected and of 1 has no edges.
    """
    edges = [(i, (i + 1) % size) for i in range(size)] + ([(0, 2)] if size >= 3 else [])
    return from_edges(edges, size=size, directed=True)


def push_sum_matrix(topology: Topology, step: int) -> np.ndarray:
    """Column-stochastic P of ``step``: every sender splits its mass equally among itself and its receivers."""
    links = (np.asarray(topology.mixing_matrix(step)) > 0).astype(np.float64)
    np.fill_diagonal(links, 1.0)
    return links / links.sum(axis=0)


def distinct_starts(size: int) -> np.ndarray:
    """A different start per rank (rows), far enough apart that a biased average shows."""
    n = SoftmaxRegression(FEATURES, CLASSES).layout.size
    return np.stack([np.random.default_rng(100 + r).normal(size=n) + 2.0 * r for r in range(size)])


def _idle_worker(engine: Engine, topology: str | Topology) -> tuple[SoftmaxRegression, Worker, SGP]:
    """A worker whose optimizer does nothing (lr 0), starting from this rank's own distinct parameters."""
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.0))
    model.set_params(distinct_starts(engine.size)[engine.rank])
    strategy = SGP(topology)
    return model, Worker(model, strategy, engine, broadcast_start=False).start(), strategy


def _idle_rounds(model: SoftmaxRegression, worker: Worker, rounds: int) -> None:
    for _ in range(rounds):
        model.grads()[:] = 0.0
        worker.before_step()
        model.optimizer_step()
        worker.after_step()


def case_sgp_directed_graph_reaches_true_average(engine: Engine) -> None:
    """Plain averaging on a directed graph settles on a biased value; push-sum finds the true mean."""
    size = engine.size
    rounds = 50 * max(size, 2)  # a directed ring mixes in O(N) rounds: |lambda_2| = cos(pi / N) for N ranks
    graph = directed_ring_with_chord(size)
    starts = distinct_starts(size)
    mean = starts.mean(axis=0)
    W = graph.mixing_matrix()
    plain = np.linalg.matrix_power(W, rounds) @ starts
    np.testing.assert_allclose(plain, plain[[0] * size], rtol=0, atol=1e-6)  # consensus, but on what value?
    if size >= 3:
        assert not is_column_stochastic(W)
        bias = np.max(np.abs(plain[0] - mean))
        assert bias > 0.1, f"plain averaging should be biased on this graph, is off by only {bias}"
    else:  # no directed graph with a bias fits in 1 or 2 ranks: then plain averaging is exact too
        assert is_doubly_stochastic(W)
        np.testing.assert_allclose(plain[0], mean, rtol=0, atol=1e-12)

    model, worker, sgp = _idle_worker(engine, graph)
    _idle_rounds(model, worker, rounds)
    np.testing.assert_allclose(model.params(), mean, rtol=0, atol=1e-6)
    # mass is conserved: the weights sum to N and the numerators to the sum of the starts
    totals = np.concatenate([sgp.numerator, [sgp.weight]])
    engine.allreduce(totals)
    np.testing.assert_allclose(totals[:-1], starts.sum(axis=0), rtol=0, atol=1e-9)
    assert abs(totals[-1] - size) < 1e-12, totals[-1]
    worker.close()


def case_sgp_one_peer_exponential_exact_in_log2_rounds(engine: Engine) -> None:
    """On the one-peer exponential graph with N = 2^k, push-sum gives the exact average after k rounds."""
    size = engine.size
    mean = distinct_starts(size).mean(axis=0)
    model, worker, sgp = _idle_worker(engine, "exp1")
    if size & (size - 1):  # not a power of two: no exactness claim, but it still converges
        _idle_rounds(model, worker, 100)
        np.testing.assert_allclose(model.params(), mean, rtol=0, atol=1e-6)
        worker.close()
        return
    rounds = size.bit_length() - 1
    if rounds:
        _idle_rounds(model, worker, rounds - 1)
        assert np.max(np.abs(model.params() - mean)) > 1e-3  # one round short is still far off
        _idle_rounds(model, worker, 1)
    np.testing.assert_allclose(model.params(), mean, rtol=0, atol=1e-12)
    assert sgp.weight == 1.0  # one out- and one in-neighbour each: halves add back to exactly 1
    _idle_rounds(model, worker, 3)  # and it stays there
    np.testing.assert_allclose(model.params(), mean, rtol=0, atol=1e-12)
    worker.close()


def case_sgp_matches_dense_push_sum_reference(engine: Engine) -> None:
    """x, w and z of every step equal a dense simulation X <- P (X - lr G(X / w)), w <- P w."""
    size, steps = engine.size, 15
    x, y, shards, _ = task(size)
    start = SoftmaxRegression(FEATURES, CLASSES, seed=0).params().copy()  # rank 0's, broadcast by the Worker
    probe = SoftmaxRegression(FEATURES, CLASSES)
    for topology in (make_topology("exp1", size), directed_ring_with_chord(size)):
        model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
        sgp = SGP(topology)
        worker = Worker(model, sgp, engine).start()
        numerators, weights = np.stack([start] * size), np.ones(size)
        for step in range(steps):
            grads = []
            for r in range(size):
                probe.set_params(numerators[r] / weights[r])
                probe.compute_gradients(*batch(x, y, shards[r], step))
                grads.append(probe.grads().copy())
            P = push_sum_matrix(topology, step)
            assert is_column_stochastic(P)
            numerators = P @ (numerators - LR * np.stack(grads))
            weights = P @ weights

            model.compute_gradients(*batch(x, y, shards[engine.rank], step))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            where = f"{topology.name} step {step}"
            np.testing.assert_allclose(sgp.numerator, numerators[engine.rank], rtol=0, atol=1e-9, err_msg=where)
            assert abs(sgp.weight - weights[engine.rank]) < 1e-12, where
            z = numerators[engine.rank] / weights[engine.rank]
            np.testing.assert_allclose(model.params(), z, rtol=0, atol=1e-9, err_msg=where)
        worker.close()


def case_sgp_trains_to_allreduce_accuracy(engine: Engine) -> None:
    x_test, y_test = task(engine.size)[3]
    accuracy = {}
    for label, strategy in (
        ("allreduce", "allreduce"),
        ("sgp:exp1", SGP("exp1")),
        ("sgp:directed", SGP(directed_ring_with_chord(engine.size))),
    ):
        model, worker = train(engine, strategy, steps=150)
        accuracy[label] = model.accuracy(x_test, y_test, worker.group.average_params())
    assert accuracy["allreduce"] > 0.9, accuracy
    assert min(accuracy.values()) >= accuracy["allreduce"] - 0.01, accuracy
