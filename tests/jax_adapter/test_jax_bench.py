"""`fast bench --framework jax` end to end: the JAX example under each strategy, its records, table and plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
from fast_cli import bench, check_job_figures

from fast_core.observers.runlog import read_run


@pytest.mark.mpi
def test_bench_jax_runs_the_example_per_strategy_and_tables_its_records(tmp_path: Path) -> None:
    bench_dir = tmp_path / "bench"
    _, rows = bench(bench_dir, *"--framework jax -n 2 --strategies allreduce,async --epochs 2 --data digits".split())
    assert list(rows) == ["allreduce", "async"] and [row["mode"] for row in rows.values()] == ["sync", "async"]
    for label, row in rows.items():
        # a budget of 2 global epochs, 640 samples per rank (drop_last), batch 16: 80 steps on each rank in lockstep;
        # under async rank 0 (its steps are the row's) trains its share of the job's 160 steps
        steps = int(row["steps"])
        assert steps == 80 if row["mode"] == "sync" else 0 < steps <= 160
        assert float(row["job_samples_per_second"]) > 0 and float(row["final_accuracy"]) > 0.9
        assert row["seconds_to_target"] != ""  # 90% validation accuracy within two epochs
        check_job_figures(row, read_run(bench_dir / label))
        records = read_run(bench_dir / label)[0]
        losses = [r["loss"] for r in records if r["kind"] == "step"]
        assert len(losses) == -(-steps // 10) and losses[-1] < losses[0]  # a record every 10 steps, the loss falling
        epochs = [r for r in records if r["kind"] == "epoch"]
        passes = -(-steps // 40)  # an epoch record per pass of rank 0 over its shard (40 batches)
        assert [r["epoch"] for r in epochs] == list(range(1, passes + 1))
        assert all(r["val_accuracy"] > 0.5 for r in epochs)
        # the consensus distance is a collective: the example computes it only under a synchronous strategy
        assert all((r["consensus_distance"] is None) == (label == "async") for r in epochs)
    for name in ("loss.png", "accuracy.png"):
        assert matplotlib.image.imread(bench_dir / name).shape[1] > 1000
