"""Multi-rank cases of the request/reply strategies: AD-PSGD and EASGD (collected by cases.py)."""

from __future__ import annotations

import time

import numpy as np
from training import CLASSES, FEATURES, LR, batch, task, train

from fast_core import Worker
from fast_core.compression import make_codec
from fast_core.engine import Engine
from fast_core.errors import ConfigError
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies.adpsgd import ADPSGD
from fast_core.strategies.easgd import EASGD


def _mean_and_spread(engine: Engine, x: np.ndarray) -> tuple[np.ndarray, float]:
    mean = x.copy()
    engine.allreduce(mean)
    mean /= engine.size
    spread = np.array([np.sum((x - mean) ** 2)])
    engine.allreduce(spread)
    return mean, float(spread[0]) / engine.size


def case_adpsgd_keeps_the_average_exactly_and_reaches_consensus(engine: Engine) -> None:
    adpsgd_keeps_the_average(engine)


def adpsgd_keeps_the_average(engine: Engine, compress: str = "none") -> list[tuple[int, int]]:
    """Idle workers (lr 0) far apart pair up: the mean of all stays exact, the spread drops 100-fold. (bytes sent,
    messages sent) of each topology's run."""
    sent = []
    for topology in ("ring", "torus"):
        model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.0), seed=engine.rank)
        model.set_params(model.params() * 50 + engine.rank)  # far apart, different on every rank
        worker = Worker(model, ADPSGD(topology, compress=compress), engine, broadcast_start=False).start()
        mean_before, spread_before = _mean_and_spread(engine, model.params())
        for _ in range(40 + 5 * engine.rank):  # ranks stop at different steps
            time.sleep(0.002)  # compute time: a pair takes one round trip, and a rank skips asking while one is open
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        worker.close()
        mean_after, spread_after = _mean_and_spread(engine, model.params())
        np.testing.assert_allclose(mean_after, mean_before, rtol=0, atol=1e-10)
        if engine.size > 1:
            assert spread_after < spread_before / 100, (topology, spread_before, spread_after)
        sent.append((worker.metrics.bytes_sent, worker.metrics.messages_sent))
    return sent


def case_adpsgd_refuses_a_directed_graph(engine: Engine) -> None:
    if engine.size < 3:
        return
    model = SoftmaxRegression(FEATURES, CLASSES)
    try:
        Worker(model, ADPSGD("exp"), engine).start()
    except ConfigError as exc:
        assert "undirected" in str(exc)
    else:
        raise AssertionError("AD-PSGD accepted a directed graph")


def easgd_reference(size: int, steps: int, tau: int, alpha: float, order_within_round: bool, sent=None):
    """NumPy EASGD: all from rank 0's start; synchronous rounds, or rank-by-rank talks to the centre (rank 0).

    ``sent(x)``: what a receiver gets of a message (a codec's round trip): the members get the centre's z through
    it, the centre each member's x; each rank's own values stay exact."""
    sent = sent or (lambda value: value)
    x, y, shards, _ = task(size)
    start = SoftmaxRegression(FEATURES, CLASSES, seed=0).params().copy()
    states = [start.copy() for _ in range(size)]
    z = start.copy()
    probe = SoftmaxRegression(FEATURES, CLASSES)
    for step in range(steps):
        for r in range(size):
            probe.set_params(states[r])
            probe.compute_gradients(*batch(x, y, shards[r], step))
            states[r] -= LR * probe.grads()
        if size == 1 or (step + 1) % tau:
            continue  # one worker alone trains as plain SGD
        old = z.copy()
        for r in range(size):
            if order_within_round:  # asynchronous, with the talks serialised in rank order
                old = z.copy()
            z += alpha * ((states[r] if r == 0 else sent(states[r])) - old)
            states[r] -= alpha * (states[r] - (old if r == 0 else sent(old)))
    return states, z


def case_easgd_synchronous_matches_reference(engine: Engine) -> None:
    strategy = EASGD(tau=3, alpha=0.2)
    model, _ = train(engine, strategy, steps=12)
    states, z = easgd_reference(engine.size, 12, 3, 0.2, order_within_round=False)
    np.testing.assert_allclose(model.params(), states[engine.rank], rtol=0, atol=1e-10)
    if engine.rank == 0:
        np.testing.assert_allclose(strategy.center_params(), z, rtol=0, atol=1e-10)


def case_easgd_asynchronous_follows_rule_in_fixed_order(engine: Engine) -> None:
    easgd_asynchronous_in_fixed_order(engine)


def easgd_asynchronous_in_fixed_order(engine: Engine, compress: str = "none") -> int:
    """Each worker talks to the centre on its own; serialised in rank order, the result is the sequential rule
    (with ``compress``: the centre reads the decoded x, the workers the decoded z). The bytes this rank sent."""
    x, y, shards, _ = task(engine.size)
    strategy = EASGD(tau=2, alpha=0.2, synchronous=False, compress=compress)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    worker = Worker(model, strategy, engine).start()
    for step in range(8):
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        worker.before_step()
        model.optimizer_step()
        for turn in range(engine.size):
            if turn == engine.rank:
                worker.after_step()
            engine.barrier()
    worker.close()
    sent = None if compress == "none" else round_trip(compress)
    states, z = easgd_reference(engine.size, 8, 2, 0.2, order_within_round=True, sent=sent)
    np.testing.assert_allclose(model.params(), states[engine.rank], rtol=0, atol=1e-10)
    if engine.rank == 0:
        np.testing.assert_allclose(strategy.center_params(), z, rtol=0, atol=1e-10)
    return worker.metrics.bytes_sent


def round_trip(codec: str):
    """What a receiver reads of a float64 vector sent as ``codec``."""
    coder = make_codec(codec)
    return lambda x: coder.decode(coder.encode(x), len(x)).astype(np.float64)


def case_pair_strategies_train_to_allreduce_accuracy(engine: Engine) -> None:
    _, _, _, (x_test, y_test) = task(engine.size)
    accuracy = {}
    strategies = {
        "allreduce": "allreduce",
        "adpsgd": ADPSGD("ring"),
        "easgd": EASGD(tau=4),
        "easgd-async": EASGD(tau=4, synchronous=False),
    }
    for name, strategy in strategies.items():
        model, worker = train(engine, strategy, steps=150)
        accuracy[name] = model.accuracy(x_test, y_test, worker.group.average_params())
    assert min(accuracy.values()) >= accuracy["allreduce"] - 0.01, accuracy
