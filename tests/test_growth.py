"""A job that grows (fast_core.runtime.joins): workers that ask to join a running fault-tolerant job are started by
it, take the group's model, step and budget share and a place in the topology, and the shared budget ends sooner.
In-process here (LocalCluster threads); under Open MPI with ULFM in tests/test_growth_mpi.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fast_core import Budget, LocalCluster, Worker
from fast_core.config.run import RunConfig
from fast_core.data.datasets import batches, shard_indices, synthetic_classification
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.runtime.joins import JOINS, JoinDesk, answer_of, ask_to_join, withdraw

BATCH, BUDGET = 16, 12_000
X, Y = synthetic_classification(n_samples=1200, n_features=10, n_classes=3, seed=0)


def train(engine, strategy: str, run_dir: Path, max_ranks: int, pause: float = 0.0) -> dict:
    """Train under a shared sample budget; a rank that joined later runs this same function (the job's command)."""
    model = SoftmaxRegression(X.shape[1], 3, seed=engine.world_ranks[engine.rank])
    config = RunConfig(run_dir=run_dir, max_ranks=max_ranks)
    worker = Worker(model, strategy, engine, observers=[], budget=Budget(samples=BUDGET), config=config)
    worker.start()
    joined_at = worker.step
    shard = shard_indices(len(Y), engine.rank, engine.size)
    epoch = 0
    while True:
        for xb, yb in batches(X[shard], Y[shard], BATCH, epoch=epoch, seed=engine.rank):
            granted = worker.claim_batch(BATCH)
            if granted == 0:
                worker.close()
                consensus = worker.group.average_params()
                return {
                    "launch": engine.world_ranks[engine.rank],
                    "size": engine.size,
                    "joined_at": joined_at,
                    "samples": worker.metrics.samples,
                    "steps": worker.step,
                    "accuracy": model.accuracy(X, Y, params=consensus),
                    "joins": [r.joined for r in worker.group.recoveries],
                    "finite": bool(np.isfinite(consensus).all()),
                }
            model.compute_gradients(xb[:granted], yb[:granted])
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            time.sleep(pause)  # a step of a real model's length, so the request lands mid-training
        epoch += 1


def _ask_when_started(run_dir: Path, workers: int, cluster_started: threading.Event) -> dict:
    """What ``fast run --join`` does: ask, then wait for the job's answer."""
    cluster_started.wait(10)
    time.sleep(0.3)
    request = ask_to_join(run_dir, workers)
    deadline = time.monotonic() + 30
    while (answer := answer_of(run_dir, request)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer or {"timed_out": withdraw(run_dir, request)}


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd:ring", "async:ring", "diloco:period=4"])
def test_workers_that_ask_to_join_take_part_and_the_budget_ends_sooner(tmp_path: Path, strategy: str) -> None:
    cluster = LocalCluster(2, timeout=60, fault_tolerant=True, max_ranks=4)
    started = threading.Event()
    answers: list[dict] = []

    def first(engine):
        started.set()
        return train(engine, strategy, tmp_path, max_ranks=4, pause=0.004)

    asker = threading.Thread(target=lambda: answers.append(_ask_when_started(tmp_path, 2, started)))
    asker.start()
    results = cluster.run(first)
    asker.join()
    assert answers and answers[0].get("joined") == [2, 3], answers
    assert [r["launch"] for r in results] == [0, 1, 2, 3]
    assert all(r["size"] == 4 for r in results)
    newcomers, members = results[2:], results[:2]
    assert all(r["joined_at"] > 0 for r in newcomers)  # they came in mid-training, from the group's step
    assert all(r["samples"] > 0 for r in newcomers)  # and trained their share of the budget
    assert BUDGET - 4 * BATCH < sum(r["samples"] for r in results) <= BUDGET  # counted once (lockstep: whole steps)
    assert all(r["steps"] < BUDGET // (2 * BATCH) for r in members)  # two workers alone would take 375 steps
    assert all(r["joins"] == [(2, 3)] for r in members)
    assert all(r["finite"] and r["accuracy"] > 0.6 for r in results)
    assert not list((tmp_path / JOINS).glob("*.ask.json"))  # served once


def test_a_job_at_its_max_ranks_refuses_with_a_reason(tmp_path: Path) -> None:
    cluster = LocalCluster(2, timeout=60, fault_tolerant=True, max_ranks=2)
    started = threading.Event()
    answers: list[dict] = []

    def first(engine):
        started.set()
        return train(engine, "allreduce", tmp_path, max_ranks=2, pause=0.004)

    asker = threading.Thread(target=lambda: answers.append(_ask_when_started(tmp_path, 1, started)))
    asker.start()
    results = cluster.run(first)
    asker.join()
    assert "--max-ranks 2" in answers[0]["refused"]
    assert [r["size"] for r in results] == [2, 2]


def test_a_malformed_request_is_answered_not_obeyed(tmp_path: Path) -> None:
    engine = LocalCluster(1, fault_tolerant=True, max_ranks=4).engine(0)
    desk = JoinDesk.for_job(tmp_path, engine)
    assert desk is not None
    (tmp_path / JOINS).mkdir()
    (tmp_path / JOINS / "bad.ask.json").write_text('{"workers": "many"}')
    desk.poll()
    assert "no whole number" in answer_of(tmp_path, "bad")["refused"]
    with pytest.raises(Exception, match="1 or more"):
        ask_to_join(tmp_path, 0)


def test_no_desk_for_a_job_that_cannot_grow(tmp_path: Path) -> None:
    assert JoinDesk.for_job(tmp_path, LocalCluster(1).engine(0)) is None  # not fault tolerant
    assert JoinDesk.for_job(tmp_path, LocalCluster(1, fault_tolerant=True).engine(0)) is None  # no --max-ranks
    assert JoinDesk.for_job(None, LocalCluster(1, fault_tolerant=True, max_ranks=2).engine(0)) is None
