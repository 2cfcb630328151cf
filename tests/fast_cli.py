"""Run the `fast` command as a user would, in a fresh process, for the CLI tests of every tox env."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from mpirun import check_fits_test_timeout

ENTRY_POINT = Path(sys.executable).parent / "fast"  # what pip installs for the `fast` entry point
FAST = [str(ENTRY_POINT)] if ENTRY_POINT.is_file() else [sys.executable, "-m", "fast_core.cli"]


def fast(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``fast args...`` with output captured (one thread per rank's math: OMP_NUM_THREADS=1); ``timeout`` must fit
    the test's pytest-timeout limit (``mpirun.check_fits_test_timeout``)."""
    check_fits_test_timeout(timeout)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*FAST, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def bench(bench_dir: Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """``fast bench args... --run-dir bench_dir``; asserts it succeeded and returns it with results.csv's rows by
    label, in the table's order."""
    done = fast("bench", *args, "--run-dir", str(bench_dir), timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(bench_dir / "results.csv") as f:
        return done, {row["label"]: row for row in csv.DictReader(f)}


def check_job_figures(row: dict, ranks: dict[int, list[dict]], target: float = 0.9) -> None:
    """The job columns of one results.csv row, recomputed from the run's records (read_run): wall-clock from the
    earliest "start" record's wall_start to the latest "close" record's wall_stop, all ranks' samples over it, the
    per-rank mean rate, and time to target on the consensus records (rank 0's epoch ends when there are none)."""
    import pytest

    closes = [next(r for r in records if r["kind"] == "close") for records in ranks.values()]
    starts = [next(r for r in records if r["kind"] == "start") for records in ranks.values()]
    wall = max(c["wall_stop"] for c in closes) - min(s["wall_start"] for s in starts)
    samples = sum(c["samples"] for c in closes)
    assert float(row["job_seconds"]) == pytest.approx(wall, rel=1e-9)
    assert float(row["job_samples"]) == samples > 0
    assert float(row["job_samples_per_second"]) == pytest.approx(samples / wall, rel=1e-9)
    per_rank = [c["samples"] / c["step_time"] for c in closes]
    assert float(row["per_rank_samples_per_second"]) == pytest.approx(sum(per_rank) / len(per_rank), rel=1e-9)
    assert all(c["step_time"] <= wall + 1e-3 for c in closes)  # no rank trained longer than the job (two clocks)
    consensus = sorted((r for rs in ranks.values() for r in rs if r["kind"] == "consensus"), key=lambda r: r["time"])
    curve = consensus or [r for r in ranks[0] if r["kind"] == "epoch"]
    assert row["target_model"] == ("consensus" if consensus else "rank 0")
    reached = [r["time"] for r in curve if r["val_accuracy"] >= target]
    if reached:
        assert float(row["seconds_to_target"]) == pytest.approx(reached[0], rel=1e-9)
    else:
        assert row["seconds_to_target"] == ""
    result = next(r for r in reversed(ranks[0]) if r["kind"] == "result")
    assert float(row["final_accuracy"]) == pytest.approx(result["test_accuracy"], rel=1e-12)


def check_fixed_straggler(bench_dir: Path, labels: list[str], rank: int) -> float:
    """Every run of the bench slept the same calibrated seconds per step on ``rank`` only: run.json's
    straggler_seconds = (factor - 1) x the calibration launch's compute per step on that rank; returns it."""
    import json

    import pytest

    from fast_core.observers.runlog import read_run
    from fast_core.observers.straggler import compute_per_step

    info = json.loads((bench_dir / "run.json").read_text())
    compute = compute_per_step(read_run(bench_dir / "calibration")[rank])
    assert info["calibrated_compute_seconds"] == pytest.approx(compute, rel=1e-12) and compute > 0
    assert info["straggler_seconds"] == pytest.approx((info["straggler"] - 1) * compute, rel=1e-12)
    for label in labels:
        for r, records in read_run(bench_dir / label.replace(":", "-")).items():
            close = next(c for c in records if c["kind"] == "close")
            if r == rank:
                assert close["straggler_slept"] == pytest.approx(close["step"] * info["straggler_seconds"], rel=1e-6)
            else:
                assert "straggler_slept" not in close
    return info["straggler_seconds"]


def check_elastic_example(script: Path, run_dir: Path, epochs: int, accuracy: float = 0.85) -> None:
    """``fast run -n 2 script`` of a Horovod elastic example in shape (tests/*/horovod*_elastic_script.py) succeeds,
    and each rank's JSON line says it trained ``epochs`` epochs to the same parameters, above ``accuracy``."""
    import json
    import re

    done = fast("run", "-n", "2", "--no-progress", "--run-dir", str(run_dir), str(script), timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [json.loads(line) for line in re.findall(r"^\[\d\] (\{.*\})$", done.stdout, re.M)]
    assert sorted(line["rank"] for line in lines) == [0, 1], done.stdout
    assert {line["epochs"] for line in lines} == {epochs}
    assert len({line["params"] for line in lines}) == 1  # all-reduce replicas, started from rank 0's sync
    assert lines[0]["accuracy"] > accuracy, lines  # chance is 0.1
