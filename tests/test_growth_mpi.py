"""Under Open MPI with ULFM: a job that grows (`fast run --max-ranks` starts it, `fast run --join` asks it for more
workers mid-training; the group spawns them, they take its model, step and budget share, train, and the job ends
with exit 0 naming them; the in-process twin is tests/test_growth.py), and a rank whose parameters turn NaN, which
leaves the job while the others finish (in-process: tests/test_nan_leaves.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fast_cli import FAST, fast
from test_launch_ft import _ulfm_mpiexec

from fast_core.observers.runlog import read_run

pytestmark = pytest.mark.mpi


def _when_training(run_dir: Path, job: subprocess.Popen, seconds: float = 60) -> None:
    """Until rank 0 has written a step record (the job trains), or the job ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and job.poll() is None:
        log = run_dir / "rank0.jsonl"
        if log.is_file() and '"kind": "step"' in log.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"the job never trained: {job.poll()=} {job.stderr.read().decode() if job.poll() else ''}")


@pytest.mark.parametrize("strategy", ["dpsgd:ring", "async:ring"])
def test_a_worker_that_asks_joins_the_running_job_and_trains_its_share(tmp_path: Path, strategy: str) -> None:
    run_dir = tmp_path / "run"
    command = [*FAST, "run", "-n", "2", "--max-ranks", "3", "--mpiexec", _ulfm_mpiexec(), "--no-progress"]
    command += ["--strategy", strategy, "--run-dir", str(run_dir), "--log-every", "10"]
    command += ["-m", "fast_examples.numpy_digits"]
    env = dict(os.environ, OMP_NUM_THREADS="1", FAST_TIMEOUT="60")
    job = subprocess.Popen(
        [*command, "--epochs", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        _when_training(run_dir, job)
        asked = fast("run", "--join", str(run_dir), "-n", "1", timeout=90)
        out, err = job.communicate(timeout=150)
    finally:
        job.kill()
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "rank(s) [2] joined the job at step" in asked.stderr
    assert job.returncode == 0, err.decode()[-3000:]
    assert "rank(s) [2] joined the job while it ran" in err.decode()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["exit_status"] == 0 and run["joined"] == [2] and run["lost_ranks"] == []
    records = read_run(run_dir)
    membership = [r for r in records[0] if r["kind"] == "membership"]
    assert [(m["joined"], m["size"]) for m in membership] == [("2", 3)]
    newcomer = records[2]
    assert newcomer[0]["kind"] == "start" and newcomer[0]["step"] >= membership[0]["step"] - 1
    closed = {rank: next(r for r in rs if r["kind"] == "close") for rank, rs in records.items()}
    assert closed[2]["samples"] > 0  # it trained a share of the job's budget
    accuracy = float(out.decode().split("test accuracy of the averaged model: ")[1].split()[0])
    assert accuracy > 0.9


def test_join_refuses_a_job_that_cannot_grow_and_a_max_ranks_that_is_not_above_the_workers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"workers": 2, "fault_tolerant": False, "exit_status": None}))
    refused = fast("run", "--join", str(run_dir), "-n", "1")
    assert refused.returncode == 2 and "started without --max-ranks, so it cannot grow" in refused.stderr
    (run_dir / "run.json").write_text(json.dumps({"fault_tolerant": True, "max_ranks": 4, "exit_status": 0}))
    ended = fast("run", "--join", str(run_dir), "-n", "1")
    assert ended.returncode == 2 and "that job has ended (exit status 0)" in ended.stderr
    missing = fast("run", "--join", str(tmp_path / "nowhere"), "-n", "1")
    assert missing.returncode == 2 and "no run.json there" in missing.stderr
    small = fast("run", "-n", "2", "--max-ranks", "2", "-m", "fast_examples.numpy_digits")
    assert small.returncode == 2 and "--max-ranks 2 is not above the 2 workers launched" in small.stderr


def _pid_of(run_dir: Path, rank: int) -> int:
    starts = [r for r in read_run(run_dir).get(rank, []) if r["kind"] == "start"]
    return int(starts[-1]["pid"])


def test_a_rank_whose_parameters_turn_nan_leaves_and_the_job_finishes_naming_it(tmp_path: Path) -> None:
    """FAST_INJECT_FAULTS=1: SIGUSR1 turns rank 2's parameters NaN; its next own check finds it, it leaves (SIGKILL
    to itself, recorded), the others finish with a finite model, and fast run names the rank and the NaN."""
    run_dir = tmp_path / "run"
    command = [*FAST, "run", "-n", "3", "--fault-tolerant", "--mpiexec", _ulfm_mpiexec(), "--no-progress"]
    command += ["--run-dir", str(run_dir), "--log-every", "10", "-m", "fast_examples.numpy_digits", "--epochs", "300"]
    env = dict(os.environ, OMP_NUM_THREADS="1", FAST_TIMEOUT="60", FAST_INJECT_FAULTS="1")
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        _when_training(run_dir, job)
        os.kill(_pid_of(run_dir, 2), signal.SIGUSR1)
        out, err = job.communicate(timeout=150)
    finally:
        job.kill()
    assert job.returncode == 0, err.decode()[-3000:]
    left = r"rank 2 \(pid \d+, host \S+\) left the group \(NonFiniteError: rank \d's parameters hold NaN"
    assert re.search(left, err.decode()), err.decode()[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["survived"] is True and [e["rank"] for e in run["lost_ranks"]] == [2]
    assert run["lost_ranks"][0]["left"].startswith("NonFiniteError")
    accuracy = float(out.decode().split("test accuracy of the averaged model: ")[1].split()[0])
    assert accuracy > 0.9
