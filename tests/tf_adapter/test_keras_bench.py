"""`fast bench --framework tf` end to end: the Keras example (TensorFlow backend) under each strategy, with the
records fast_tf.Callback writes for it: epoch logs, samples per step, the example's test accuracy."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
from fast_cli import bench, check_job_figures

from fast_core.observers.runlog import read_run


@pytest.mark.mpi
def test_bench_tf_runs_the_keras_example_per_strategy_and_tables_its_records(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    bench_dir = tmp_path / "bench"
    _, rows = bench(bench_dir, *"--framework tf -n 2 --strategies allreduce,async --epochs 2 --data digits".split())
    assert list(rows) == ["allreduce", "async"] and [row["mode"] for row in rows.values()] == ["sync", "async"]
    for label, row in rows.items():
        # a budget of 2 global epochs, 640 samples per rank (40 batches of 16): 80 steps on each rank in lockstep;
        # under async rank 0 (its steps are the row's) trains its share of the job's 160 steps
        steps = int(row["steps"])
        assert steps == 80 if row["mode"] == "sync" else 0 < steps <= 160
        assert float(row["job_samples_per_second"]) > 0 and float(row["final_accuracy"]) > 0.85
        check_job_figures(row, read_run(bench_dir / label))
        records = read_run(bench_dir / label)[0]
        closed = next(r for r in records if r["kind"] == "close")
        assert closed["samples"] == 16 * steps  # Callback(batch_size=16) counts each step's samples
        epochs = [r for r in records if r["kind"] == "epoch"]
        assert [r["epoch"] for r in epochs] == list(range(1, -(-steps // 40) + 1))  # a Keras epoch per pass
        assert all(0.5 < r["val_accuracy"] <= 1 and r["loss"] > 0 for r in epochs), epochs  # Keras' epoch logs
        assert epochs[-1]["loss"] < epochs[0]["loss"]
        assert all((r.get("consensus_distance") is None) == (label == "async") for r in epochs)
    for name in ("loss.png", "accuracy.png"):
        assert matplotlib.image.imread(bench_dir / name).shape[1] > 1000
