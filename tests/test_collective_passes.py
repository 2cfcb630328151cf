"""Claims.collective_passes (``worker.claims``): after which of its passes over its shard a rank may call an epoch-end
collective (FAST's restart) under a shared budget, knowing every rank calls it too; and a run that does so under an
asynchronous strategy with a slow rank ends without hanging (LocalCluster, the last rank slower by a sleep per step)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from training import CLASSES, FEATURES, LR, task

from fast_core import Budget, LocalCluster, Worker
from fast_core.data.datasets import batches
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression


def _worker(strategy: str, budget: Budget | None, size: int = 4) -> Worker:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR))
    engine = LocalCluster(size).engine(0)
    return Worker(model, strategy, engine, observers=[], budget=budget)


@pytest.mark.parametrize(
    ("strategy", "budget", "expected"),
    [
        ("allreduce", Budget(samples=10_000), None),  # lockstep: every pass, all ranks run the same steps
        ("fast:torus,synchronous=true", Budget(seconds=5.0), None),
        ("async:ring", None, None),  # no budget: each rank trains its own shard the same number of times
        ("async:ring", Budget(samples=3 * 1280, ahead=1), 2),  # E global epochs: the first E - 1
        ("async:ring", Budget(samples=3 * 1280, ahead=4), 2),
        ("async:ring", Budget(samples=3 * 1280 + 200, ahead=1), 3),  # room for the reservations past 3 passes
        ("async:ring", Budget(samples=4 * 1280), 2),  # adaptive: reservations of up to MAX_AHEAD (16) batches
        ("async:ring,warmup=30", Budget(samples=3 * 1280, ahead=1), 2),  # asynchronous after its warm-up
        ("async:ring", Budget(samples=1280), 0),
        ("fast:torus", Budget(seconds=5.0), 0),  # when the time is up is unknown in passes
        ("fast:torus", Budget(samples=3 * 1280, seconds=5.0), 0),
    ],
)
def test_collective_passes(strategy: str, budget: Budget | None, expected: int | None) -> None:
    # 4 ranks, batch 16, a global epoch of 1280 samples (20 batches per rank); reserved: 2 x ahead x 4 x 16
    # (ahead: MAX_AHEAD when it adapts)
    assert _worker(strategy, budget).claims.collective_passes(1280, 16) == expected


def test_fast_restarts_after_the_sure_passes_end_without_a_hang_under_a_straggler() -> None:
    size, batch_size, epochs = 4, 16, 3

    def rank(engine: Engine) -> tuple[int, int, int]:
        x, y, shards, _ = task(engine.size)
        shard = shards[engine.rank][:320]  # 20 batches per pass on every rank
        model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
        job_pass = len(shard) * size
        worker = Worker(model, "fast:torus", engine, observers=[], budget=Budget(samples=epochs * job_pass, ahead=1))
        worker.start()
        restarts = worker.claims.collective_passes(job_pass, batch_size)
        done = passes = 0
        for epoch in range(1000):
            trained = 0
            for xb, yb in batches(x[shard], y[shard], batch_size, epoch, seed=engine.rank):
                n = worker.claim_batch(len(yb))
                if n == 0:
                    break
                model.compute_gradients(xb[:n], yb[:n])
                time.sleep(0.004 if engine.rank == size - 1 else 0.0005)
                worker.run_step(model.optimizer_step)
                trained += n
            if trained:
                passes += 1
                if epoch < restarts:
                    worker.end_epoch(model.accuracy(x[shard], y[shard]))  # FAST: a collective restart
                    done += 1
            if trained < len(shard) - len(shard) % batch_size:
                break
        worker.close()
        return done, passes, int(worker.metrics.job_samples)

    results = LocalCluster(size, timeout=60).run(rank)
    assert [done for done, _, _ in results] == [epochs - 1] * size
    assert {job for _, _, job in results} == {epochs * 320 * size}
    passes = np.array([p for _, p, _ in results])
    assert passes[:-1].max() > passes[-1], passes  # after the last restart the fast ranks did more passes
