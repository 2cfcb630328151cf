"""Multi-rank cases of "no silent corruption" (collected by cases.py): mismatched strategies stop every rank with one
message, NaN parameters are refused by the neighbours and stop the rank that made them, and collectives of different
kinds never match."""

from __future__ import annotations

import time

import numpy as np
from training import CLASSES, FEATURES, LR, batch, task

from fast_core import Worker
from fast_core.engine import Engine, collectives
from fast_core.errors import ConfigError, PeerTimeout
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies.integrity import OWN_CHECK_EVERY, NonFiniteError
from fast_core.topology import make_topology

POISONED_AT = 2  # the step after whose optimizer step the last rank's parameters turn NaN (not a checked step)


def case_mismatched_strategies_fail_on_every_rank_with_one_message(engine: Engine) -> None:
    if engine.size < 2:
        return
    strategy = "allreduce" if engine.rank == 0 else "localsgd"
    others = "rank 1 runs" if engine.size == 2 else f"ranks 1-{engine.size - 1} run"
    try:
        Worker(SoftmaxRegression(FEATURES, CLASSES, seed=0), strategy, engine).start()
    except ConfigError as exc:
        said = f"rank 0 runs 'allreduce:compress=none', {others} 'localsgd:period=4'; every rank must"
        assert str(exc).startswith(said), exc
        assert "FAST_STRATEGY" in str(exc) and "\n" not in str(exc), exc
    else:
        raise AssertionError("ranks running different strategies started training")


def _poisoned_run(engine: Engine, strategy: str) -> tuple[SoftmaxRegression, Worker, Exception | None]:
    """Train on every rank; the last rank's parameters turn NaN after step POISONED_AT. Synchronous neighbours run
    until the step their last message from it is due, asynchronous ones until they refused one; the error each
    rank ended with (the NaN rank's own, or a neighbour's wait on the stopped rank at close) is returned."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=0)
    worker = Worker(model, strategy, engine).start()
    bad = engine.size - 1
    deadline = time.monotonic() + 5.0
    error: Exception | None = None
    try:
        while worker.step <= OWN_CHECK_EVERY or (
            not worker.strategy.lockstep and engine.rank != bad and _waiting_for_refusal(worker, bad)
        ):
            if time.monotonic() > deadline:
                raise AssertionError(f"rank {engine.rank} saw no NaN from rank {bad} in 5 s")
            model.compute_gradients(*batch(x, y, shards[engine.rank], worker.step))
            worker.before_step()
            model.optimizer_step()
            if engine.rank == bad and worker.step == POISONED_AT:
                model.params()[:3] = np.nan
            worker.after_step()
            time.sleep(0.002)  # lets the asynchronous messages move
    except NonFiniteError as exc:
        error = exc
    try:
        worker.close()
    except PeerTimeout as exc:  # a synchronous neighbour of the stopped rank waits for its next message in vain
        error = exc
    return model, worker, error


def _waiting_for_refusal(worker: Worker, bad: int) -> bool:
    neighbours = make_topology("ring", worker.engine.size).in_neighbors(worker.engine.rank)
    return bad in neighbours and worker.metrics.refused_messages == 0


def _check_poisoned_run(engine: Engine, strategy: str) -> None:
    if engine.size < 2:
        return
    side = engine.dup(timeout=1.5)  # neighbours of the stopped rank wait for it in vain at close: briefly
    model, worker, error = _poisoned_run(side, strategy)
    bad = engine.size - 1
    if engine.rank == bad:
        assert isinstance(error, NonFiniteError), error
        assert f"rank {bad}'s parameters hold NaN or Inf at step {OWN_CHECK_EVERY}" in str(error), error
        return
    assert np.isfinite(model.params()).all(), f"rank {engine.rank} took NaN from rank {bad}"
    neighbours = make_topology("ring", engine.size).in_neighbors(engine.rank)
    if bad in neighbours:
        assert worker.metrics.refused_messages > 0, worker.metrics.as_dict()
        assert worker.metrics.as_dict()["refused_messages"] == worker.metrics.refused_messages
        if worker.strategy.lockstep:
            assert isinstance(error, PeerTimeout) and bad in error.ranks, error
    else:
        assert worker.metrics.refused_messages == 0 and error is None, (worker.metrics.refused_messages, error)


def case_nan_parameters_are_refused_under_dpsgd_and_stop_their_rank(engine: Engine) -> None:
    _check_poisoned_run(engine, "dpsgd:ring")


def case_nan_parameters_are_refused_under_async_and_stop_their_rank(engine: Engine) -> None:
    _check_poisoned_run(engine, "async:ring")


def case_a_nan_born_after_the_last_check_is_never_the_consensus_model(engine: Engine) -> None:
    """The last rank's parameters turn NaN after its last step (no check of its own runs again): the consensus
    model a script reports is refused on every rank with the same error naming that rank, and nothing hangs."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=0)
    worker = Worker(model, "dpsgd:ring", engine).start()
    for _ in range(3):
        model.compute_gradients(*batch(x, y, shards[engine.rank], worker.step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    if engine.rank == engine.size - 1:
        model.params()[5] = np.inf
    try:
        worker.group.average_params()
    except NonFiniteError as exc:
        assert str(exc).startswith(f"the consensus model holds NaN or Inf: rank(s) [{engine.size - 1}] hold"), exc
    else:
        raise AssertionError("a consensus model holding Inf was returned")


def case_different_collectives_of_the_same_size_never_match(engine: Engine) -> None:
    """Rank 0 averages the consensus model while the others all-reduce a gradient of the same size: each waits in
    its own collective and stops with a PeerTimeout naming the ranks that never joined it; no values are mixed."""
    if engine.size < 2:
        return
    side = engine.dup(timeout=0.5)
    model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
    mine = np.full(model.layout.size, float(engine.rank), dtype=model.layout.dtype)
    model.set_params(mine)
    try:
        if engine.rank == 0:
            collectives.average_params(model, side)
        else:
            side.allreduce(model.grads(), kind="gradients")
    except PeerTimeout as exc:
        others = list(range(1, engine.size)) if engine.rank == 0 else [0]
        assert list(exc.ranks) == others, exc
        assert ("job allreduce" if engine.rank == 0 else "gradients allreduce") in str(exc), exc
    else:
        raise AssertionError(f"rank {engine.rank}'s collective matched a collective of another kind")
    np.testing.assert_array_equal(model.params(), mine)
