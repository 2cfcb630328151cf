"""``fast run --slurm`` on a real SLURM (issue 27): slurmctld and a slurmd per namespace host
(benchmarks/slurm_cluster.py), jobs submitted with ``sbatch examples/slurm/train.sbatch`` as a user would.

Opt-in (``FAST_SLURM=1``, ``tox -e slurm``): the module installs slurm-wlm and munge with apt-get where they are
missing, takes the namespace hosts (so not beside tests/test_cluster.py), and runs about two minutes. The core env
sets ``FAST_SLURM=quick``: the sbatch job and scancel only (about 40 s beside the install), the torch and requeue
tests stay in ``tox -e slurm``. Skipped with the reason where that cannot be done (not root, no namespaces, no
apt-get).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fast_cli import fast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import netns_cluster as nc  # noqa: E402
import slurm_cluster as sc  # noqa: E402

TEMPLATE = ROOT / "examples" / "slurm" / "train.sbatch"
QUICK = "quick"
"""FAST_SLURM=quick (the core env): the two short tests; FAST_SLURM=1 all of them."""
long_test = pytest.mark.skipif(
    os.environ.get("FAST_SLURM") == QUICK, reason="FAST_SLURM=quick runs the short tests: tox -e slurm runs this one"
)
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict[str, str]:
    """The cluster (4 nodes), up for this module's tests and down after them; the environment its commands need."""
    if os.environ.get("FAST_SLURM") not in ("1", QUICK):
        pytest.skip("real-SLURM tests are opt-in: FAST_SLURM=1 (tox -e slurm); they apt-get slurm-wlm and munge")
    reason = nc.why_not()
    if reason:
        pytest.skip(f"no namespace hosts here: {reason}")
    if nc.namespaces() or (sc.FOLDER / "slurm.conf").exists():
        pytest.skip("a cluster is up already: `python benchmarks/slurm_cluster.py down` (or cluster.py down) first")
    try:
        sc.install()
        sc.up(4, "100mbit")
    except sc.SlurmClusterError as error:
        pytest.skip(f"no SLURM here: {error}")
    try:
        yield dict(os.environ, **sc.environment(), OMP_NUM_THREADS="1")
    finally:
        sc.down()


def sbatch(
    env: dict[str, str], run_dir: Path, *args: str, options: tuple[str, ...] = (), script: Path = TEMPLATE
) -> str:
    """Submit the template (its ``--epochs`` etc. after it), the run folder and log in ``run_dir``; the job id."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = ["sbatch", "--parsable", f"--chdir={run_dir}", f"--output={run_dir}/%j.out", *options, str(script)]
    done = subprocess.run([*command, *args], env={**env, "RUN_DIR": str(run_dir / "run")}, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip().split(";")[0]


def wait_gone(env: dict[str, str], job: str, seconds: float = 240) -> float:
    """Seconds until ``job`` has left the queue (asserted within ``seconds``); a requeued job made eligible at once
    (SLURM holds one back about two minutes)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], env=env, capture_output=True, text=True)
        if not state.stdout.strip():
            return time.monotonic() - start
        if "BeginTime" in state.stdout:
            subprocess.run(["scontrol", "update", f"jobid={job}", "starttime=now"], env=env, capture_output=True)
        time.sleep(0.5)
    raise AssertionError(f"job {job} still queued after {seconds:g} s")


def wait_training(run_dir: Path, step: int, seconds: float = 60) -> None:
    """Until rank 0 recorded step ``step`` or later in ``run_dir/run``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        log = run_dir / "run" / "rank0.jsonl"
        if log.exists() and any(json.loads(line).get("step", 0) >= step for line in log.read_text().splitlines()[-5:]):
            return
        time.sleep(0.2)
    raise AssertionError(f"rank 0 did not reach step {step} in {seconds:g} s")


def job_processes(job: str) -> list[str]:
    """Every process of this machine whose environment says SLURM job ``job`` (what an orphan would keep)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"SLURM_JOB_ID={job}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ')[:80]!r}")
        except OSError:
            continue
    return found


def accuracy(text: str) -> float:
    return float(re.findall(r"test accuracy of the averaged model: ([0-9.]+)", text)[-1])


def test_an_sbatch_job_of_4_ranks_on_4_nodes_trains_as_under_mpiexec(slurm, tmp_path: Path) -> None:
    job = sbatch(slurm, tmp_path / "slurm", "--epochs", "5")
    wait_gone(slurm, job, 120)
    log = (tmp_path / "slurm" / f"{job}.out").read_text()
    assert "4 of 4 task(s) on fast-h0:1, fast-h1:1, fast-h2:1, fast-h3:1" in log, log
    hosts = {json.loads(Path(f).read_text().splitlines()[0]).get("host") for f in (tmp_path / "slurm" / "run").glob(
        "rank*.jsonl")}
    assert hosts == {"fast-h0", "fast-h1", "fast-h2", "fast-h3"}  # one rank a node, each under its own hostname
    local = fast("run", "-n", "4", "--strategy", "dpsgd:ring", "--run-dir", str(tmp_path / "mpiexec"),
                 "-m", "fast_examples.numpy_digits", "--epochs", "5")
    assert local.returncode == 0, local.stderr
    assert accuracy(log) == accuracy(local.stdout)  # the same job: the same numbers


@long_test
def test_the_torch_example_on_4_nodes_reaches_the_accuracy_it_reaches_under_mpiexec(slurm, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the torch example needs torch (pip install 'fast-training[torch]')")
    example = ["--strategy", "dpsgd:ring", "--no-progress", "-m", "fast_examples.torch_mnist1d", "--data", "digits",
               "--epochs", "3"]
    command = " ".join(["fast", "run", "--slurm", "--run-dir", str(tmp_path / "slurm"), *example])
    done = subprocess.run(["sbatch", "--parsable", "-N", "4", "--ntasks-per-node=1", f"--chdir={tmp_path}",
                           f"--output={tmp_path}/%j.out", "--wrap", command], env=slurm, capture_output=True,
                          text=True, check=True)
    job = done.stdout.strip().split(";")[0]
    wait_gone(slurm, job, 300)
    log = (tmp_path / f"{job}.out").read_text()
    local = fast("run", "-n", "4", "--run-dir", str(tmp_path / "mpiexec"), *example, timeout=300)
    assert local.returncode == 0, local.stderr
    assert accuracy(log) == accuracy(local.stdout)


def test_scancel_ends_every_rank_with_no_orphan_and_a_clear_record(slurm, tmp_path: Path) -> None:
    job = sbatch(slurm, tmp_path, "--epochs", "5000")
    wait_training(tmp_path, 50)
    assert len(job_processes(job)) >= 8  # fast run, mpiexec, srun, 4 guards and their ranks at least
    subprocess.run(["scancel", job], env=slurm, check=True)
    deadline = time.monotonic() + 15
    while job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert job_processes(job) == []
    wait_gone(slurm, job, 60)
    ran = json.loads((tmp_path / "run" / "run.json").read_text())
    assert ran["exit_status"] == 143 and "lost" not in ran  # SIGTERM from SLURM: a stop, no rank lost


@long_test
@pytest.mark.parametrize("how", ["requeue", "node down"])
def test_a_requeued_job_resumes_from_its_checkpoint_and_finishes_its_budget(slurm, tmp_path: Path, how: str) -> None:
    epochs = 300
    job = sbatch(slurm, tmp_path, "--epochs", str(epochs))
    wait_training(tmp_path, 400)
    if how == "requeue":
        subprocess.run(["scontrol", "requeue", job], env=slurm, check=True)
    else:  # SLURM kills the job on a failed node and, the job asking --requeue, queues it again
        subprocess.run(["scontrol", "update", "nodename=fast-h3", "state=down", "reason=fast-test"], env=slurm,
                       check=True)
    wait_gone(slurm, job)
    log = (tmp_path / f"{job}.out").read_text()
    if how == "node down":
        assert "Node failure on fast-h3" in log or "DUE TO NODE FAILURE" in log, log
    resumed = re.search(r"resumed from .* at step (\d+) \((\d+) samples trained before\)", log)
    assert resumed is not None, log
    lost = last_step_before_restart(tmp_path / "run" / "rank0.jsonl") - int(resumed.group(1))
    assert 0 <= lost <= PASS + 10  # at most the pass since the checkpoint (and rank 0 records every 10th step)
    spent = re.findall(r"budget spent: (\d+) samples trained by the job", log)[-1]
    assert int(spent) + int(resumed.group(2)) == epochs * GLOBAL_EPOCH  # the whole budget, nothing trained twice


PASS = 20
"""Steps of one pass of a rank over its shard (323 digits, batches of 16): the template's checkpoints are that far
apart."""
GLOBAL_EPOCH = PASS * 16 * 4
"""Samples of one global epoch on 4 ranks."""


def last_step_before_restart(log: Path) -> int:
    """The last step rank 0 recorded before its log's second "start" record (the requeued job's)."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    starts = [i for i, r in enumerate(records) if r.get("kind") == "start"]
    assert len(starts) >= 2, "rank 0 started once only"
    return max(r["step"] for r in records[: starts[1]] if "step" in r)


def _ulfm_python() -> Path | None:
    """A Python whose bin holds Open MPI's mpiexec built with ULFM (FAST_FT_PYTHON, else this one), or None."""
    for python in (os.environ.get("FAST_FT_PYTHON"), sys.executable):
        info = Path(python).parent / "ompi_info" if python else None
        if info is not None and info.is_file():
            listing = subprocess.run([str(info)], capture_output=True, text=True, timeout=30).stdout
            if "FT MPI support: yes" in listing:
                return Path(python)
    return None


FAULT_TOLERANT_JOB = """#!/bin/bash
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --no-kill
exec {python} -m fast_core.cli run --slurm --fault-tolerant --mpiexec {mpiexec} --run-dir "$RUN_DIR" --no-progress \\
    -m fast_examples.numpy_digits --epochs 5000
"""


@long_test
def test_a_node_down_under_fault_tolerance_ends_the_job_naming_the_node(slurm, tmp_path: Path) -> None:
    """ULFM survives a lost rank, not a node SLURM takes away (it kills the step that holds Open MPI's daemons, and
    Open MPI's mpiexec still exits 0): fast run --slurm names the node and fails (docs/slurm.md)."""
    python = _ulfm_python()
    if python is None:
        pytest.skip("needs Open MPI with ULFM beside this Python or FAST_FT_PYTHON (the mpi-ft extra)")
    script = tmp_path / "ft.sbatch"
    script.write_text(FAULT_TOLERANT_JOB.format(python=python, mpiexec=python.parent / "mpiexec"))
    job = sbatch(slurm, tmp_path, script=script)
    try:
        wait_training(tmp_path, 50, seconds=180)  # Open MPI starts slowly across the namespace hosts
        down = ["scontrol", "update", "nodename=fast-h3", "state=down", "reason=fast-test"]
        subprocess.run(down, env=slurm, check=True)
        wait_gone(slurm, job, 120)
    finally:
        subprocess.run(["scontrol", "update", "nodename=fast-h3", "state=resume"], env=slurm, capture_output=True)
    log = (tmp_path / f"{job}.out").read_text()
    assert "SLURM removed node(s) fast-h3 from job" in log, log
    ran = json.loads((tmp_path / "run" / "run.json").read_text())
    assert ran["exit_status"] == 1 and ran["slurm_lost_nodes"] == ["fast-h3"], ran
