"""`fast bench --framework torch` end to end: fast_torch strategies and torch DistributedDataParallel, 2 ranks.

Four mpiexec launches (each pays the torch import on both ranks), one epoch each, on the 8x8 digits: the
straggler's calibration, then three runs in which it sleeps the same calibrated seconds per step, DDP included.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest
from fast_cli import bench, check_fixed_straggler, check_job_figures

from fast_core.observers.runlog import read_run


@pytest.mark.mpi
@pytest.mark.timeout(380)  # four launches of torch on 2 ranks: the bench's own 360 s must not be cut at 300
def test_bench_torch_compares_strategies_with_ddp(tmp_path: Path) -> None:
    bench_dir = tmp_path / "bench"
    options = "--framework torch -n 2 --strategies allreduce,async --epochs 1 --compare-ddp --data digits --straggler 2"
    _, rows = bench(bench_dir, *options.split(), timeout=360)
    assert list(rows) == ["allreduce", "async", "DDP"]
    assert [rows[label]["mode"] for label in rows] == ["sync", "async", "DDP"]
    assert float(rows["DDP"]["vs_baseline"]) == 1.0  # DDP is the baseline when it ran
    assert rows["DDP"]["bytes_sent_per_step"] == ""  # gloo's traffic is not the FAST worker's to count
    for label, row in rows.items():
        # a budget of 1 global epoch, 640 samples per rank, batch 16: 40 steps on each rank in lockstep; under async
        # rank 0 (its steps are the row's) trains its share of the job's 80 steps, more when it is the faster
        steps = int(row["steps"])
        assert float(row["job_samples_per_second"]) > 0 and (0 < steps <= 80 if row["mode"] == "async" else steps == 40)
        assert float(row["final_accuracy"]) > 0.5
        check_job_figures(row, read_run(bench_dir / label))
    # a fair straggler: DDP (whose all-reduce runs inside backward) sleeps the same seconds per step as the others
    check_fixed_straggler(bench_dir, list(rows), rank=1)

    # DDP and fast_torch's all-reduce run the same model, data, order and steps: the same training, up to rounding
    loss = {label: [r["loss"] for r in read_run(bench_dir / label)[0] if r["kind"] == "step"] for label in rows}
    assert len(loss["DDP"]) == len(loss["allreduce"]) == 4
    assert loss["DDP"] == pytest.approx(loss["allreduce"], rel=1e-4)
    assert rows["DDP"]["final_accuracy"] == rows["allreduce"]["final_accuracy"]
    ddp_epoch = next(r for r in read_run(bench_dir / "DDP")[1] if r["kind"] == "epoch")
    assert ddp_epoch["consensus_distance"] == pytest.approx(0.0, abs=1e-12)  # DDP's replicas stay identical

    table = (bench_dir / "results.md").read_text()
    assert "| `DDP` | DDP |" in table and "vs DDP" in table
    for name in ("loss.png", "accuracy.png"):
        assert matplotlib.image.imread(bench_dir / name).shape[1] > 1000
