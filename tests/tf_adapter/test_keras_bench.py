"""`fast bench --framework tf` end to end: the Keras example (TensorFlow backend) under each strategy, with the
records fast_tf.Callback writes for it: epoch logs, samples per step, the example's test accuracy."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
from fast_cli import bench, check_job_figures

from fast_core.runlog import read_run


@pytest.mark.mpi
def test_bench_tf_runs_the_keras_example_per_strategy_and_tables_its_records(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    bench_dir = tmp_path / "bench"
    _, rows = bench(bench_dir, *"--framework tf -n 2 --strategies allreduce,async --epochs 2 --data digits".split())
    assert list(rows) == ["allreduce", "async"] and [row["mode"] for row in rows.values()] == ["sync", "async"]
    assert rows["allreduce"]["steps"] == rows["async"]["steps"]  # the same shards and batches
    for label, row in rows.items():
        assert float(row["job_samples_per_second"]) > 0 and float(row["final_accuracy"]) > 0.85
        check_job_figures(row, read_run(bench_dir / label))
        records = read_run(bench_dir / label)[0]
        steps = int(row["steps"])
        closed = next(r for r in records if r["kind"] == "close")
        assert closed["samples"] == 16 * steps  # Callback(batch_size=16) counts each step's samples
        epochs = [r for r in records if r["kind"] == "epoch"]
        assert [r["epoch"] for r in epochs] == [1, 2]
        assert all(0.5 < r["val_accuracy"] <= 1 and r["loss"] > 0 for r in epochs), epochs  # Keras' epoch logs
        assert epochs[-1]["loss"] < epochs[0]["loss"]
        assert all((r.get("consensus_distance") is None) == (label == "async") for r in epochs)
    for name in ("loss.png", "accuracy.png"):
        assert matplotlib.image.imread(bench_dir / name).shape[1] > 1000
