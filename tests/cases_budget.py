"""Multi-rank cases of the shared work budget (collected by cases.py): the last rank is made slower by a sleep per
step; no assertion is on an absolute time.

The stop signal of an asynchronous sample budget is the moment rank 0's counter reached 0 (``spent_at``, a
``time.monotonic()`` reading: one clock for the threads of a LocalCluster and for the processes of one machine);
after it a rank may train only the batches it had reserved: one with ``ahead=1``, at most 2k - 1 with ``ahead=k``
(adaptive, the default: k is the rank's reservation at the end, which only grows).
"""

from __future__ import annotations

import time

import numpy as np
from training import CLASSES, FEATURES, LR, batch, task

from fast_core import Budget, Worker
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression

BATCH = 8
FAST_PAUSE, SLOW_PAUSE = 0.001, 0.02
"""Seconds each step sleeps: every rank but the last, and the last."""


def _train(engine: Engine, strategy: str, budget: Budget, batch_size: int = BATCH):
    """Train until claim_batch says stop; return the worker and every claim as (time it returned, samples)."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    worker = Worker(model, strategy, engine, observers=[], budget=budget).start()
    claims: list[tuple[float, int]] = []
    while True:
        n = worker.claim_batch(batch_size)
        claims.append((time.monotonic(), n))
        if n == 0:
            break
        xb, yb = batch(x, y, shards[engine.rank], worker.step)
        model.compute_gradients(xb[:n], yb[:n])
        time.sleep(SLOW_PAUSE if engine.rank == engine.size - 1 else FAST_PAUSE)
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    assert worker.claim_batch(batch_size) == 0  # spent stays spent
    worker.close()
    return worker, claims


def _per_rank(engine: Engine, value: float) -> np.ndarray:
    values = np.zeros(engine.size)
    values[engine.rank] = value
    engine.allreduce(values)
    return values


def case_asynchronous_sample_budget_is_shared_exactly_and_stops_every_rank_within_one_step(engine: Engine) -> None:
    samples = BATCH * 25 * engine.size + 5  # not a multiple of the batch: one grant in the job is partial
    for strategy, ahead in (("async:ring", 1), ("adpsgd:ring", 1), ("async:ring", 3), ("async:ring", None)):
        worker, claims = _train(engine, strategy, Budget(samples=samples, ahead=ahead))
        if ahead is None:  # adaptive: bounded by the reservation the rank grew to (rank 0 reserves nothing: 1)
            ahead = worker.claims.allowance.ahead
        reserved = worker.claims.allowance.ahead
        assert engine.rank == 0 or reserved == ahead, (strategy, ahead, reserved)
        granted = [n for _, n in claims]
        assert worker.step == len(granted) - 1 and sum(granted) == worker.metrics.samples, (strategy, granted)
        assert worker.metrics.job_samples == samples, (strategy, worker.metrics.job_samples)
        partial = _per_rank(engine, sum(0 < n < BATCH for n in granted))
        assert partial.sum() == 1, (strategy, partial)
        signal = np.array([worker.claims.allowance.spent_at if engine.rank == 0 else 0.0])
        engine.broadcast(signal, root=0)
        after = [n for t, n in claims if t > signal[0]]
        assert after[-1] == 0 and sum(n > 0 for n in after) <= 2 * ahead - 1, (strategy, engine.rank, after)
        steps = _per_rank(engine, worker.step)
        assert all(steps[r] > steps[-1] for r in range(engine.size - 1)), (strategy, steps)  # the fast did more


def case_lockstep_sample_budget_runs_the_same_steps_on_every_rank(engine: Engine) -> None:
    samples = 40 * engine.size + 3  # not a multiple of the job's step: the remainder is not trained
    for strategy, batch_size in (("allreduce", BATCH), ("dpsgd:ring", BATCH + engine.rank)):
        worker, _ = _train(engine, strategy, Budget(samples=samples), batch_size)
        per_step = _per_rank(engine, batch_size).sum()  # the job's samples per step
        steps = _per_rank(engine, worker.step)
        assert (steps == samples // per_step).all(), (strategy, steps, per_step)
        assert worker.metrics.job_samples == steps[0] * per_step <= samples, (strategy, worker.metrics.job_samples)


def case_seconds_budget_ends_every_rank_and_close_completes(engine: Engine) -> None:
    seconds = 0.25
    for strategy in ("async:ring", "allreduce"):
        worker, claims = _train(engine, strategy, Budget(seconds=seconds))
        stopped = claims[-1][0] - worker.claims.allowance.started  # on this rank's clock, from the common start
        steps = _per_rank(engine, worker.step)
        assert worker.metrics.job_samples == steps.sum() * BATCH, (strategy, steps)
        if strategy == "allreduce":  # lockstep: every rank stops at the same step, once the first saw the deadline
            assert steps.min() == steps.max() and _per_rank(engine, stopped).max() >= seconds, (strategy, steps)
        else:  # each rank on its own clock: none stopped before the deadline
            assert stopped >= seconds, (strategy, stopped)


def case_both_limits_the_first_spent_ends_training(engine: Engine) -> None:
    worker, _ = _train(engine, "async:ring", Budget(samples=BATCH * 3 * engine.size, seconds=60.0))
    assert worker.metrics.job_samples == BATCH * 3 * engine.size  # the samples ran out long before the minute


def case_no_budget_changes_nothing(engine: Engine) -> None:
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    worker = Worker(model, "async:ring", engine, observers=[]).start()
    for step in range(5):
        assert worker.claim_batch(BATCH) == BATCH
        assert worker.claim_batch(BATCH) == BATCH  # a claim holds until the step is taken
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    assert worker.claims.budget is None and worker.claims.allowance is None and worker.metrics.job_samples is None
    assert worker.metrics.samples == 5 * BATCH and worker.step == 5
