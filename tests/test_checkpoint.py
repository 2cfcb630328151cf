"""Checkpoints (fast_core.runtime.checkpoint): saved on 4 ranks, resumed on 2 and 8; a resumed budget trains what was
left; a crash while writing leaves the previous checkpoint; bad files are one line on every rank; under asynchronous
averaging a loaded checkpoint is not pulled back toward the start parameters (issue 13, point 3)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from mpirun import TESTS, run_mpi
from training import CLASSES, FEATURES, LR, batch, task

from fast_core import Budget, LocalCluster, Worker
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, AdaGrad, SoftmaxRegression
from fast_core.runtime import checkpoint
from fast_core.runtime.checkpoint import CheckpointError
from fast_core.strategies.integrity import NonFiniteError

STEPS, BATCH = 6, 8


def _worker(engine: Engine, strategy: str, optimizer=None, budget: Budget | None = None, seed: int = 0) -> Worker:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=optimizer or SGD(LR), seed=seed + engine.rank)
    return Worker(model, strategy, engine, observers=[], budget=budget).start()


def _steps(worker: Worker, engine: Engine, steps: int | None, pause: float = 0.0) -> None:
    """``steps`` steps (None: until the budget is spent), each claiming a batch."""
    x, y, shards, _ = task(engine.size)
    done = 0
    while steps is None or done < steps:
        n = worker.claim_batch(BATCH)
        if n == 0:
            break
        xb, yb = batch(x, y, shards[engine.rank], worker.step)
        worker.model.compute_gradients(xb[:n], yb[:n])
        worker.before_step()
        worker.model.optimizer_step()
        worker.after_step()
        time.sleep(pause)
        done += 1


def _save_adagrad(engine: Engine, path: str) -> tuple[np.ndarray, np.ndarray, int]:
    worker = _worker(engine, "dpsgd:ring", AdaGrad(lr=0.05))
    _steps(worker, engine, STEPS)
    model = worker.model
    checkpoint.save(path, worker, {"sum_sq": model.optimizer.sum_sq}, extra={"note": "adagrad"})
    out = model.params().copy(), model.optimizer.sum_sq.copy(), worker.step
    worker.close()
    return out


def _load_adagrad(engine: Engine, path: str) -> tuple[np.ndarray, np.ndarray, int, dict]:
    worker = _worker(engine, "allreduce", AdaGrad(lr=0.05), seed=50)
    loaded = checkpoint.load(path, worker)
    worker.model.optimizer.sum_sq = loaded.state["sum_sq"]
    out = worker.model.params().copy(), worker.model.optimizer.sum_sq.copy(), worker.step, loaded.header
    _steps(worker, engine, 2)  # it trains on from there
    worker.close()
    return out


def test_saved_on_four_ranks_it_resumes_on_two_and_on_eight_with_the_average_and_its_state(tmp_path: Path) -> None:
    path = str(tmp_path / "job.ckpt")
    saved = LocalCluster(4, timeout=30).run(_save_adagrad, path)
    mean_params = np.mean([p for p, _, _ in saved], axis=0)
    mean_state = np.mean([s for _, s, _ in saved], axis=0)
    assert not np.allclose(saved[0][0], saved[1][0])  # the ranks differed: the average is a real one
    for size in (2, 8):
        for params, state, step, header in LocalCluster(size, timeout=30).run(_load_adagrad, path):
            np.testing.assert_allclose(params, mean_params, rtol=0, atol=1e-12)
            np.testing.assert_allclose(state, mean_state, rtol=0, atol=1e-12)
            assert step == saved[0][2] == STEPS
            assert header["ranks"] == 4 and header["extra"] == {"note": "adagrad"}
            assert "DPSGD" in header["strategy"]
    assert [name for name in os.listdir(tmp_path)] == ["job.ckpt"]  # no temporary file left


@pytest.mark.mpi
def test_under_mpiexec_saved_on_four_ranks_it_resumes_on_two_with_the_average(tmp_path: Path) -> None:
    """The same save and load across real MPI launches (tests/checkpoint_mpi.py): 4 ranks save, 2 load."""
    path = str(tmp_path / "job.ckpt")
    run_mpi(4, TESTS / "checkpoint_mpi.py", "save", path, str(tmp_path), timeout=120)
    saved = [np.load(tmp_path / f"save{rank}.npz") for rank in range(4)]
    run_mpi(2, TESTS / "checkpoint_mpi.py", "load", path, str(tmp_path), timeout=120)
    for rank in range(2):
        loaded = np.load(tmp_path / f"load{rank}.npz")
        np.testing.assert_allclose(loaded["params"], np.mean([s["params"] for s in saved], axis=0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(loaded["state"], np.mean([s["state"] for s in saved], axis=0), rtol=0, atol=1e-12)
        assert int(loaded["step"]) == STEPS
    assert not np.allclose(saved[0]["params"], saved[1]["params"])  # the ranks differed: a real average


def _budgeted(engine: Engine, path: str, resume: bool, samples: int) -> tuple[int, int, int]:
    worker = _worker(engine, "async:ring", budget=Budget(samples=samples, ahead=1))
    if resume:
        checkpoint.load(path, worker)
        _steps(worker, engine, None)
    else:
        _steps(worker, engine, 5)
        checkpoint.save(path, worker)
    worker.close()
    return worker.metrics.job_samples, worker.claims.samples_before, worker.step


def test_a_resumed_budgeted_run_trains_exactly_the_samples_left(tmp_path: Path) -> None:
    path, samples = str(tmp_path / "budget.ckpt"), 4 * 5 * BATCH + 200 + 3
    first = LocalCluster(4, timeout=30).run(_budgeted, path, False, samples)
    spent = first[0][0]
    assert spent == 4 * 5 * BATCH  # 5 claimed batches per rank before the save
    second = LocalCluster(2, timeout=30).run(_budgeted, path, True, samples)
    assert {job for job, _, _ in second} == {samples - spent}  # not the whole budget again
    assert {before for _, before, _ in second} == {spent}
    assert all(step > 5 for _, _, step in second)  # steps go on from the checkpoint's


def _save_twice_second_crashes(engine: Engine, path: str, monkeypatch) -> list[str]:
    worker = _worker(engine, "allreduce")
    checkpoint.save(path, worker)
    first = worker.group.average_params()
    worker.model.params()[:] += 1.0
    if engine.rank == 0:  # the writer dies between writing and renaming
        monkeypatch.setattr(os, "replace", _crash)
    engine.barrier()
    try:
        checkpoint.save(path, worker)
        error = ""
    except CheckpointError as exc:
        error = str(exc)
    engine.barrier()
    monkeypatch.undo()
    loaded = checkpoint.load(path, worker)
    np.testing.assert_array_equal(loaded.params, first)  # the previous checkpoint, whole
    worker.close()
    return error


def _crash(src, dst):
    raise OSError("simulated crash before the rename")


def test_a_crash_while_writing_leaves_the_previous_checkpoint_intact(tmp_path: Path, monkeypatch) -> None:
    path = str(tmp_path / "safe.ckpt")
    errors = LocalCluster(2, timeout=30).run(_save_twice_second_crashes, path, monkeypatch)
    assert errors[0] == errors[1] and "simulated crash" in errors[0] and "\n" not in errors[0]
    assert os.listdir(tmp_path) == ["safe.ckpt"]


def _load_error(engine: Engine, path: str, features: int) -> str:
    model = SoftmaxRegression(features, CLASSES, seed=engine.rank)
    worker = Worker(model, "async:ring", engine, observers=[]).start()
    try:
        checkpoint.load(path, worker)
    except CheckpointError as exc:
        return str(exc)
    finally:
        worker.close()
    return "loaded"


def _save_plain(engine: Engine, path: str) -> None:
    worker = _worker(engine, "allreduce")
    checkpoint.save(path, worker)
    worker.close()


@pytest.mark.parametrize("kind", ["missing", "torn", "random bytes", "pickle", "pickle in an archive", "another model"])
def test_a_bad_checkpoint_is_one_line_on_every_rank_never_a_hang(tmp_path: Path, kind: str) -> None:
    path, features = tmp_path / "bad.ckpt", FEATURES
    if kind == "torn":
        LocalCluster(1).run(_save_plain, str(path))
        path.write_bytes(path.read_bytes()[:200])
    elif kind == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "pickle":
        np.save(open(path, "wb"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "pickle in an archive":
        np.savez(open(path, "wb"), params=np.array([{"a": 1}], dtype=object))
    elif kind == "another model":
        LocalCluster(1).run(_save_plain, str(path))
        features = FEATURES + 1
    errors = LocalCluster(3, timeout=30).run(_load_error, str(path), features)
    assert len(set(errors)) == 1 and "\n" not in errors[0], errors
    expected = {"missing": "no checkpoint", "another model": "another model"}.get(kind, "not a FAST checkpoint")
    assert expected in errors[0] and str(path) in errors[0]
    assert "allow_pickle" not in errors[0]  # NumPy's advice would invite unpickling: never given


def test_a_save_killed_mid_write_leaves_nothing_behind_at_the_next_save(tmp_path: Path) -> None:
    path = tmp_path / "job.ckpt"
    (tmp_path / ".job.ckpt.ckpt-x1y2.tmp").write_bytes(b"half of a checkpoint")  # what kill -9 during a save leaves
    (tmp_path / ".other.ckpt.ckpt-x1y2.tmp").write_bytes(b"another job's save in progress")
    LocalCluster(1).run(_save_plain, str(path))
    assert sorted(os.listdir(tmp_path)) == [".other.ckpt.ckpt-x1y2.tmp", "job.ckpt"]


def _async_lr0(engine: Engine, path: str, strategy: str, trained_first: bool = False) -> np.ndarray:
    optimizer = SGD(LR if trained_first else 0.0)
    worker = _worker(engine, strategy, optimizer, seed=10)  # setup posts these start parameters
    if trained_first:  # the strategy's state (push-sum weight, pair averages, centre) moved from its start
        _steps(worker, engine, 6, pause=0.002)
        optimizer.lr = 0.0
    checkpoint.load(path, worker)
    _steps(worker, engine, 30, pause=0.002)
    worker.close()
    return worker.model.params().copy()


def _save_ones(engine: Engine, path: str) -> None:
    worker = _worker(engine, "allreduce")
    worker.model.params()[:] = 1.0
    checkpoint.save(path, worker)
    worker.close()


@pytest.mark.parametrize(
    "strategy",
    [
        "async:ring",
        "async:ring,keep_progress=false",
        "async:ring,every=2",
        "fast:ring",
        "dpsgd:ring",
        "adpsgd:ring",
        "easgd",
        "easgd:synchronous=false",
        "gossip",
        "gossip:push,synchronous=false",
        "gossip:pull,synchronous=false",
        "sgp",
    ],
)
def test_a_loaded_checkpoint_is_not_pulled_back_to_the_start_by_what_the_strategy_kept(
    tmp_path: Path, strategy: str
) -> None:
    path = str(tmp_path / "ones.ckpt")
    LocalCluster(2).run(_save_ones, path)
    for trained_first in (False, True):  # loaded at the start, and after 6 steps
        for params in LocalCluster(4, timeout=30).run(_async_lr0, path, strategy, trained_first):
            np.testing.assert_allclose(params, 1.0, rtol=0, atol=1e-12)  # lr 0: nothing may move them


def _save_with_a_nan_rank(engine: Engine, path: str) -> str:
    worker = _worker(engine, "allreduce")
    if engine.rank == 1:
        worker.model.params()[0] = np.nan
    with pytest.raises(NonFiniteError) as refused:  # on every rank
        checkpoint.save(path, worker)
    worker.close()
    return str(refused.value)


def test_a_model_holding_nan_is_never_saved_and_a_file_holding_nan_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "nan.ckpt"
    errors = LocalCluster(3, timeout=30).run(_save_with_a_nan_rank, str(path))
    assert len(set(errors)) == 1 and "the model to checkpoint holds NaN or Inf: rank(s) [1]" in errors[0], errors
    assert os.listdir(tmp_path) == []
    LocalCluster(1).run(_save_plain, str(path))
    with np.load(path) as saved:  # a file someone else edited: FAST never writes one
        members = {name: saved[name] for name in saved.files}
    members["params"][3] = np.inf
    np.savez(open(path, "wb"), **members)
    errors = LocalCluster(2, timeout=30).run(_load_error, str(path), FEATURES)
    assert errors == [f"checkpoint {str(path)!r} holds NaN or Inf parameters: it is not loaded"] * 2
