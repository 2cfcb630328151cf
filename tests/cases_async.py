"""Multi-rank cases of the asynchronous machinery: the Mailbox, async averaging and FAST (collected by cases.py)."""

from __future__ import annotations

import numpy as np
from training import CLASSES, FEATURES, batch, steps_in_window, task, train

from fast_core import Worker
from fast_core.compression import Codec, message_seed
from fast_core.engine import Engine
from fast_core.model.numpy_model import AdaGrad, SoftmaxRegression
from fast_core.strategies.adpsgd import ADPSGD
from fast_core.strategies.async_avg import AsyncAveraging
from fast_core.strategies.easgd import EASGD
from fast_core.strategies.fast import FAST
from fast_core.strategies.gossip import Gossip
from fast_core.topology import make_topology


def reference_fast(size: int, steps: int, lr: float, codec: Codec | None = None) -> list[np.ndarray]:
    """Synchronous FAST in NumPy: own AdaGrad step, then one per neighbour gradient (rank order). With ``codec``
    the neighbours apply what it decodes of each sender's gradient plus its error-feedback residual (float32)."""
    x, y, shards, _ = task(size)
    graph = make_topology("torus", size)
    start = SoftmaxRegression(FEATURES, CLASSES, seed=0).params().copy()  # rank 0's, broadcast by the Worker
    states = [start.copy() for _ in range(size)]
    optimizers = [AdaGrad(lr) for _ in range(size)]
    residuals = [np.zeros(len(start), np.float32) for _ in range(size)]
    probe = SoftmaxRegression(FEATURES, CLASSES)
    for step in range(steps):
        grads = []
        for r in range(size):
            probe.set_params(states[r])
            probe.compute_gradients(*batch(x, y, shards[r], step))
            grads.append(probe.grads().copy())
        sent = grads
        if codec is not None:
            sent = []
            for r in range(size):
                corrected, seed = grads[r].astype(np.float32) + residuals[r], message_seed(step, r, size)
                decoded = codec.decode(codec.encode(corrected, seed), len(corrected), seed)
                residuals[r] = corrected - decoded
                sent.append(decoded.astype(np.float64))
        for r in range(size):
            optimizers[r].step(states[r], grads[r])
            for peer in graph.in_neighbors(r):
                optimizers[r].step(states[r], sent[peer])
    return states


def case_fast_synchronous_matches_adagrad_reference(engine: Engine) -> None:
    """FAST: own AdaGrad step, then one AdaGrad step per neighbour gradient (rank order), checked to 1e-10."""
    steps, lr = 12, 0.05
    model, _ = train(engine, FAST(synchronous=True), steps, optimizer=AdaGrad(lr))
    states = reference_fast(engine.size, steps, lr)
    np.testing.assert_allclose(model.params(), states[engine.rank], rtol=0, atol=1e-10)


def case_restart_from_best_replica(engine: Engine) -> None:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=AdaGrad(0.1), seed=engine.rank)
    worker = Worker(model, FAST(synchronous=True, restart_every=2, reset_optimizer=True), engine).start()
    x, y, shards, _ = task(engine.size)
    for epoch in range(2):
        for step in range(3):
            model.compute_gradients(*batch(x, y, shards[engine.rank], 3 * epoch + step))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        before = model.params().copy()
        best = (engine.size - 1) // 2  # a middle rank wins, and ties go to the lowest rank
        worker.end_epoch(metric=1.0 if engine.rank >= best else 0.0)
    worker.close()
    expected = before.copy()
    engine.broadcast(expected, root=best)
    np.testing.assert_array_equal(model.params(), expected)
    assert model.optimizer.sum_sq is None, "reset_optimizer=True must clear AdaGrad's state"


def case_async_strategies_finish_on_every_topology(engine: Engine) -> None:
    """No deadlock, whatever the graph, the relative speeds, or the step at which each rank stops."""
    jitter = np.random.default_rng(engine.rank)
    for topology in ("ring", "torus", "exp"):
        strategies = [AsyncAveraging(topology), AsyncAveraging(topology, staleness=1), FAST(topology)]
        strategies += [ADPSGD(topology)] if topology != "exp" else [EASGD(tau=2, synchronous=False)]
        for strategy in strategies:
            steps = 12 + 3 * engine.rank  # ranks stop at different steps
            _, worker = train(engine, strategy, steps, pause=lambda _: jitter.uniform(0, 0.004))
            assert worker.metrics.steps == steps
            if engine.size > 1:
                assert worker.metrics.messages_received > 0 and worker.metrics.bytes_sent > 0, worker.metrics


def case_staleness_bound_is_respected(engine: Engine) -> None:
    slow = 0
    pause = 0.01 if engine.rank == slow else 0.0
    for bound in (0, 2):
        _, worker = train(engine, AsyncAveraging("ring", staleness=bound), 25, pause=pause)
        assert worker.metrics.staleness_max <= bound, (bound, worker.metrics)


def case_straggler_does_not_slow_async_workers(engine: Engine) -> None:
    """In a fixed time, a 5x slower rank does not hold the others back (counted in steps done)."""
    if engine.size < 2:
        return
    straggler = engine.size - 1
    strategies = [AsyncAveraging("ring"), FAST("ring", restart_every=None), ADPSGD("ring")]
    strategies += [
        EASGD(tau=2, synchronous=False),
        Gossip("pull", synchronous=False),
        Gossip("push", synchronous=False),
    ]
    for strategy in strategies:
        counts = steps_in_window(engine, strategy, straggler, slowdown=5)
        assert np.delete(counts, straggler).min() >= 2.5 * counts[straggler], (strategy, counts)


def case_async_strategies_train_to_allreduce_accuracy(engine: Engine) -> None:
    _, _, _, (x_test, y_test) = task(engine.size)
    # How far below all-reduce's accuracy (0.9575, deterministic) each may end. Measured with 4 ranks on 2 cores
    # busy with a CI run: async:torus 0.955-0.965, fast:torus 0.9325-0.9675 (13 runs of each): each neighbour
    # gradient is one more optimizer step, so its effective rate depends on how many arrive. Diverging ends far lower.
    tolerance = {"allreduce": 0.0, "async": 0.01, "fast": 0.03}
    accuracy: dict[str, float] = {}
    for name, strategy in (("allreduce", "allreduce"), ("async", "async:torus"), ("fast", "fast:torus")):
        for _ in range(2):  # an asynchronous run depends on timing: one that misses trains once more
            model, worker = train(engine, strategy, steps=150)
            accuracy[name] = model.accuracy(x_test, y_test, worker.group.average_params())  # the same on every rank
            if accuracy[name] >= accuracy["allreduce"] - tolerance[name]:
                break
    assert all(accuracy[n] >= accuracy["allreduce"] - tolerance[n] for n in accuracy), accuracy


def rank0_against_stalled_neighbours(
    engine: Engine, strategy: AsyncAveraging, steps: int, update: float, rule, start=None
) -> None:
    """Every rank starts at ``start(rank, size)`` (default: its rank number); the others send their first message
    and stall while rank 0 adds ``update`` to its parameters before each of ``steps`` steps. ``rule(step, expected,
    own, pulls)`` gives rank 0's expected value after a step (``expected`` already holds the update); rank 0 checks
    every element against it."""
    start = start or (lambda rank, size: np.full(size, float(rank)))
    model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
    model.set_params(start(engine.rank, model.layout.size))
    worker = Worker(model, strategy, engine, broadcast_start=False).start()
    if engine.rank == 0:
        graph = make_topology("ring", engine.size)
        own, pulls = graph.self_weight(0), graph.in_weights(0)
        for peer in pulls:
            strategy._mailbox.wait_for(peer, min_step=0)
        expected = start(0, model.layout.size)
        for step in range(steps):
            model.set_params(model.params() + update)  # the optimizer's update of this step
            worker.after_step()
            expected = rule(step, expected + update, own, pulls)
        np.testing.assert_allclose(model.params(), expected, rtol=1e-12, err_msg=repr(strategy))
    engine.barrier()
    worker.close()


def case_async_averaging_mixes_each_message_once_unless_remix_stale(engine: Engine) -> None:
    """Rank 0 steps while the others stall after their first message: by default it mixes their parameters once
    and then keeps its own (a stalled neighbour lends its weight back); remix_stale=True pulls again every step."""
    if engine.size == 1:
        return
    for remix in (False, True):

        def rule(step, expected, own, pulls, remix=remix):
            if remix or step == 0:
                return own * expected + sum(w * peer for peer, w in pulls.items())
            return expected

        strategy = AsyncAveraging("ring", remix_stale=remix, keep_progress=False)  # the rule above is the plain one
        rank0_against_stalled_neighbours(engine, strategy, 5, 0.0, rule)


def case_async_averaging_keep_progress_mixes_differences_from_what_was_sent(engine: Engine) -> None:
    """keep_progress=True: rank 0 adds an update d before each step while the others stall after their first
    message; it mixes their parameters once as x += sum_j w_j (x_j - x_sent), keeping every update whole, where the
    plain rule (keep_progress=False) scales its own progress by w_ii at that step."""
    if engine.size == 1:
        return
    for keep in (False, True):

        def rule(step, expected, own, pulls, keep=keep):
            if step != 0:  # only the first message of each neighbour is fresh
                return expected
            if keep:  # rank 0 had sent its start, 0
                return expected + sum(w * (peer - 0.0) for peer, w in pulls.items())
            return own * expected + sum(w * peer for peer, w in pulls.items())

        rank0_against_stalled_neighbours(engine, AsyncAveraging("ring", keep_progress=keep), 4, 0.25, rule)
