"""Multi-rank cases of Local SGD and of the composition wrappers Every and Schedule (collected by cases.py).

Each strategy runs through the Worker hooks as an adapter would and is compared, after every step, with a dense
NumPy simulation of all N workers written here from the update rule, not from the implementation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from training import CLASSES, FEATURES, LR, batch, task, train

from fast_core import Worker
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies import Every, LocalSGD, Schedule
from fast_core.topology import make_topology

STEPS = 24
Rule = Callable[[int, np.ndarray, np.ndarray], np.ndarray]
"""(step, parameters of all workers, their gradients) -> parameters after the step, one row per worker."""


def simulate(size: int, steps: int, rule: Rule) -> list[np.ndarray]:
    """All workers' parameters after each step, every worker starting from rank 0's initial parameters."""
    x, y, shards, _ = task(size)
    model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
    states = np.stack([model.params().copy() for _ in range(size)])
    history = []
    for step in range(steps):
        grads = []
        for r in range(size):
            model.set_params(states[r])
            model.compute_gradients(*batch(x, y, shards[r], step))
            grads.append(model.grads().copy())
        states = rule(step, states, np.stack(grads))
        history.append(states.copy())
    return history


def run(engine: Engine, strategy, steps: int, probe: Callable[[int, np.ndarray], None]) -> Worker:
    """Train like tests/training.py's ``train``, calling ``probe(step, params)`` after every step on every rank."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    worker = Worker(model, strategy, engine).start()
    for step in range(steps):
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
        probe(step, model.params())
    worker.close()
    return worker


def spread(engine: Engine, params: np.ndarray) -> float:
    """Largest difference of any parameter between any two ranks (collective)."""
    low, high = params.copy(), params.copy()
    engine.allreduce(low, op="min")
    engine.allreduce(high, op="max")
    return float(np.max(high - low))


def checker(engine: Engine, history: list[np.ndarray], identical: Callable[[int], bool]) -> Callable:
    """A probe asserting this rank follows the reference and all ranks agree bit for bit where ``identical``."""

    def probe(step: int, params: np.ndarray) -> None:
        np.testing.assert_allclose(params, history[step][engine.rank], rtol=0, atol=1e-10, err_msg=f"step {step}")
        if identical(step):
            assert spread(engine, params) == 0.0, f"workers differ right after step {step}"

    return probe


# rules -------------------------------------------------------------------------------------------------------


def local_sgd_rule(period: int) -> Rule:
    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        states = states - LR * grads
        if (step + 1) % period == 0:
            states = np.broadcast_to(states.mean(axis=0), states.shape).copy()
        return states

    return rule


def every_dpsgd_rule(size: int, topology: str, k: int) -> Rule:
    """Gossip every k steps: round r mixes the parameters sent at its start with W(r), keeping the local steps."""
    graph = make_topology(topology, size)
    sent: list[np.ndarray] = []
    rounds = [0]

    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        if not sent:
            sent.append(states.copy())
        states = states - LR * grads
        if (step + 1) % k == 0:
            states = graph.mixing_matrix(rounds[0]) @ sent[0] + (states - sent[0])
            sent[0] = states.copy()
            rounds[0] += 1
        return states

    return rule


def dpsgd_step(graph, step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
    return graph.mixing_matrix(step) @ states - LR * grads


def allreduce_step(states: np.ndarray, grads: np.ndarray) -> np.ndarray:
    return states - LR * grads.mean(axis=0)


# cases -------------------------------------------------------------------------------------------------------


def case_compose_local_sgd_matches_reference(engine: Engine) -> None:
    period = 4
    history = simulate(engine.size, STEPS, local_sgd_rule(period))
    worker = run(engine, LocalSGD(period), STEPS, checker(engine, history, lambda s: (s + 1) % period == 0))
    if engine.size > 1:  # between averaging steps the workers drift apart
        assert np.max(np.ptp(history[period], axis=0)) > 1e-6
    # one allreduce per averaging step, counted by the worker's metrics
    nbytes = worker.model.layout.empty().nbytes
    assert worker.metrics.bytes_sent == (STEPS // period) * int(2 * nbytes * (engine.size - 1) / engine.size)
    assert worker.metrics.messages_sent == 0


def case_compose_every_dpsgd_matches_reference(engine: Engine) -> None:
    """Every(3, ring) and, for the round-indexed time, Every(2, one-peer exponential graph)."""
    for topology, k in (("ring", 3), ("exp1", 2)):
        history = simulate(engine.size, STEPS, every_dpsgd_rule(engine.size, topology, k))
        run(engine, Every(k, f"dpsgd:{topology}"), STEPS, checker(engine, history, lambda s: False))


def case_compose_warmup_then_dpsgd_matches_reference(engine: Engine) -> None:
    """All-reduce for 5 steps (identical workers), then D-PSGD on the one-peer graph indexed by the global step."""
    warm = 5
    graph = make_topology("exp1", engine.size)

    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        return allreduce_step(states, grads) if step < warm else dpsgd_step(graph, step, states, grads)

    history = simulate(engine.size, STEPS, rule)
    last: list[np.ndarray] = []

    def probe(step: int, params: np.ndarray) -> None:
        checker(engine, history, lambda s: s < warm)(step, params)
        last[:] = [params.copy()]

    run(engine, "dpsgd:exp1,warmup=5", STEPS, probe)
    if engine.size > 1:
        assert spread(engine, last[0]) > 1e-6, "D-PSGD after the warm-up should let the workers differ"


def case_compose_schedule_switches_from_gossip(engine: Engine) -> None:
    """D-PSGD, whose exchange for the next step is in flight at the switch, then Local SGD from step 7."""
    switch, period = 7, 3
    graph = make_topology("ring", engine.size)

    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        if step < switch:
            return dpsgd_step(graph, step, states, grads)
        return local_sgd_rule(period)(step, states, grads)

    history = simulate(engine.size, STEPS, rule)
    identical = checker(engine, history, lambda s: s >= switch and (s + 1) % period == 0)
    schedule = Schedule([(switch, "dpsgd:ring"), (None, LocalSGD(period))])
    run(engine, schedule, STEPS, identical)


def case_compose_strategies_reach_allreduce_accuracy(engine: Engine) -> None:
    _, _, _, (x_test, y_test) = task(engine.size)
    accuracy = {}
    for strategy in ("allreduce", "localsgd", "dpsgd:ring,every=2", "dpsgd:exp1,warmup=20"):
        model, worker = train(engine, strategy, steps=150)
        accuracy[strategy] = model.accuracy(x_test, y_test, worker.group.average_params())
    assert accuracy["allreduce"] > 0.9, accuracy
    assert min(accuracy.values()) >= accuracy["allreduce"] - 0.01, accuracy
