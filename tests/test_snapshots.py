"""The consensus model over time (fast_core.observers.snapshots): each rank's snapshots at wall-clock points, averaged
exactly (checked against a NumPy reference kept in memory, not against the files), only at points every rank reached,
and the final consensus model at the job's stop; "consensus" records through the Worker's reporting.

In-process on a LocalCluster; ranks sleep per step (the last rank longest), so they reach different numbers of
points. No assertion is on an absolute time.
"""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import numpy as np
import pytest
from training import CLASSES, FEATURES, LR, batch, task

from fast_core import Budget, LocalCluster, Observer, Worker
from fast_core.engine import Engine
from fast_core.metrics import Metrics
from fast_core.model.contract import ModelAdapter
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.observers import snapshots as snapshots_module
from fast_core.observers.events import ComputeEnded, Started
from fast_core.observers.reporting import Reporter
from fast_core.observers.runlog import read_run
from fast_core.observers.snapshots import Snapshots, consensus_curve, loaded
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve

EVERY = 0.03
"""Seconds between snapshots."""


class Reference(Observer):
    """Placed after Snapshots: when its point count grows, the points just saved hold the parameters of now."""

    def __init__(self, snapshots: Snapshots, model: ModelAdapter) -> None:
        self.snapshots = snapshots
        self.model = model
        self.saved: list[np.ndarray] = []

    def _catch_up(self, event: Started | ComputeEnded) -> None:
        while len(self.saved) < self.snapshots.points:
            self.saved.append(np.array(self.model.params(), copy=True))

    on_start = on_compute_end = _catch_up


def _train(engine: Engine, folder: Path, strategy: str, steps: int, observers=()) -> tuple[Worker, Reference]:
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank, dtype="float32")
    worker = Worker(model, strategy, engine, observers=list(observers))
    snapshots = worker.observers.attach(Snapshots(folder, EVERY, engine.rank, model.params))
    reference = worker.observers.attach(Reference(snapshots, model))
    worker.start()
    pause = 0.004 * (1 + 3 * (engine.rank == engine.size - 1))  # the last rank 4x slower
    for step in range(steps):
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        time.sleep(pause)
        worker.run_step(model.optimizer_step)
    worker.close()
    return worker, reference


@pytest.mark.parametrize("strategy", ["async:ring", "allreduce"])
def test_the_consensus_curve_averages_every_ranks_snapshots_exactly(tmp_path: Path, strategy: str) -> None:
    size, steps = 3, 40

    def rank(engine: Engine):
        worker, reference = _train(engine, tmp_path, strategy, steps)
        return reference.saved, np.array(worker.model.params(), copy=True)

    results = LocalCluster(size).run(rank)
    saved = [points for points, _ in results]
    common = min(len(points) for points in saved)
    assert common >= 2 and all(len(points) >= common for points in saved)
    if strategy == "async:ring":  # the same steps: the fast ranks stopped long before the slow one, whose later
        assert len(saved[-1]) > len(saved[0]), [len(points) for points in saved]  # points are left out
    seen: list[np.ndarray] = []

    def evaluate(flat: np.ndarray) -> float:
        seen.append(flat)
        return float(len(seen))

    curve = consensus_curve(tmp_path, evaluate, size)
    assert len(curve) == common + 1
    assert [seconds for seconds, _ in curve[:-1]] == pytest.approx([k * EVERY for k in range(common)])
    assert [value for _, value in curve] == list(range(1, common + 2))  # the evaluation of each average, in order
    for point in range(common):
        expected = (sum(points[point].astype(np.float64) for points in saved) / size).astype(np.float32)
        assert seen[point].dtype == np.float32 and np.array_equal(seen[point], expected), point
    final = (sum(params.astype(np.float64) for _, params in results) / size).astype(np.float32)
    assert np.array_equal(seen[-1], final)  # the consensus model at the end: the mean of the closed ranks' models
    manifests = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(size)]
    assert curve[-1][0] == max(m["stop"] for m in manifests) >= curve[-2][0]  # the job's stop: the last rank's
    assert np.array_equal(saved[0][0], saved[-1][0])  # point 0: every rank's common start model


def test_rank_0_records_the_consensus_curve_through_the_workers_reporting(tmp_path: Path) -> None:
    size, run_dir = 2, tmp_path / "run"

    def rank(engine: Engine):
        x, y, shards, (x_test, y_test) = task(engine.size)
        reporter = Reporter(engine.rank, run_dir, 5, progress=False, verbose=False)
        worker, _ = _train(engine, run_dir / "snapshots", "async:ring", 20, observers=[reporter])
        snapshots = next(o for o in worker.observers if isinstance(o, Snapshots))
        return record_consensus_curve(worker, snapshots, lambda: worker.model.accuracy(x_test, y_test))

    curves = LocalCluster(size).run(rank)
    assert curves[1] == [] and len(curves[0]) >= 2
    records = read_run(run_dir)
    consensus = [r for r in records[0] if r["kind"] == "consensus"]
    assert [(r["time"], r["val_accuracy"]) for r in consensus] == curves[0]
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in consensus)
    assert not [r for r in records[1] if r["kind"] == "consensus"]
    assert not (run_dir / "snapshots").exists()  # removed once evaluated (keep=True keeps them)


def test_loaded_restores_the_models_own_parameters() -> None:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=0)
    own = model.params().copy()
    with loaded(model, np.zeros_like(own)):
        assert not model.params().any()
    assert np.array_equal(model.params(), own)


def test_snapshots_attached_after_the_start_save_point_0_now(tmp_path: Path) -> None:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=0)
    worker = Worker(model, "allreduce", LocalCluster(1).engine(0), observers=[], budget=Budget(samples=64)).start()
    snapshots = attach_snapshots(worker, tmp_path, 60.0)
    assert snapshots.points == 1 and np.array_equal(np.load(tmp_path / "rank0" / "0.npy"), model.params())
    worker.close()
    assert json.loads((tmp_path / "rank0.json").read_text())["points"] == 1


@pytest.mark.parametrize("every", [0, -1.0, float("nan"), "1", True])
def test_a_bad_interval_is_one_line(tmp_path: Path, every) -> None:
    with pytest.raises(ValueError, match=r"^Snapshots\(every_seconds=.*\): give the seconds between snapshots"):
        Snapshots(tmp_path, every, 0, np.zeros)


def test_a_missing_rank_names_its_manifest(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "every_seconds": 1.0, "points": 0, "stop": 0.0}))
    with pytest.raises(FileNotFoundError, match="rank1.json is missing: rank 1 did not close"):
        consensus_curve(tmp_path, lambda flat: 0.0, size=2)
    with pytest.raises(FileNotFoundError, match="no snapshots in"):
        consensus_curve(tmp_path / "empty", lambda flat: 0.0)


def test_a_long_job_keeps_at_most_max_points_and_the_curve_uses_the_points_every_rank_kept(
    tmp_path: Path, monkeypatch
) -> None:
    """Past MAX_POINTS a rank drops every other point and doubles its interval; two ranks that thinned a different
    number of times still give a curve, over the points both kept, averaged exactly."""
    monkeypatch.setattr(snapshots_module, "MAX_POINTS", 8)
    clock = {"now": 0.0}
    monkeypatch.setattr(snapshots_module, "time", types.SimpleNamespace(monotonic=lambda: clock["now"]))
    values = {0: np.zeros(3, np.float32), 1: np.ones(3, np.float32)}
    ranks = {r: Snapshots(tmp_path, 1.0, r, lambda r=r: values[r] * clock["now"]) for r in (0, 1)}
    for rank in ranks.values():
        rank.on_start(Started(0, 2, strategy="", strategy_name="", started_at=0.0, metrics=Metrics()))
    for second in range(1, 40):  # rank 1 stops at 23 s: it thinned fewer times
        clock["now"] = second + 0.5
        for r, snap in ranks.items():
            if r == 0 or second < 23:
                snap.on_compute_end(ComputeEnded(second, 0.0))
                snap.on_step_end(None)
    for snap in ranks.values():
        snap.on_close(None)
    kept = {r: sorted(int(p.stem) for p in (tmp_path / f"rank{r}").glob("[0-9]*.npy")) for r in ranks}
    assert len(kept[0]) <= 8 and len(kept[1]) <= 8
    assert ranks[0].stride == 8 and ranks[1].stride == 4
    assert kept[0] == list(range(0, ranks[0].points, 8))
    curve = consensus_curve(tmp_path, lambda flat: float(flat[0]))
    assert [t for t, _ in curve[:-1]] == [0.0, 8.0, 16.0]  # the points both kept, below rank 1's last
    assert [v for _, v in curve[:-1]] == pytest.approx([0.0, 8.5 / 2, 16.5 / 2])  # mean of 0 and the point's time
