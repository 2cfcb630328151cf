"""Horovod's elastic training on FAST with a real kill -9: a Horovod elastic script (tests/horovod_elastic_script.py,
NumPy, FAST's import only) under `fast run --fault-tolerant` on 4 ranks, one of which kills itself with SIGKILL
between two commits. The survivors re-form, restore the last commit, sync and finish with the weights one process
computes (every step applied exactly once); with `--max-restarts 1` a new process takes the lost rank's place and
finishes with them. Needs Open MPI built with ULFM (as tests/test_survival_mpi.py: skipped otherwise, saying so,
unless FAST_REQUIRE_ULFM is set)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import horovod_elastic_script as script
import numpy as np
from fast_cli import FAST
from test_survival_mpi import PYTHON, pytestmark  # noqa: F401 - the same ULFM check, skip and marks

SCRIPT = Path(__file__).with_name("horovod_elastic_script.py")
ROOT = SCRIPT.parent.parent


def _fast_run(tmp_path: Path, victim: str, restarts: int) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    """`fast run --fault-tolerant` of the script on 4 ranks (no hang: a timeout fails the test); the finishers'
    records by launch number."""
    out = tmp_path / "out"
    out.mkdir()
    mpiexec = str(Path(PYTHON).parent / "mpiexec")
    command = [*FAST, "run", "-n", "4", "--no-progress", "--fault-tolerant", "--max-restarts", str(restarts)]
    command += ["--mpiexec", mpiexec, "--run-dir", str(tmp_path / "run"), str(SCRIPT), str(out), victim]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "FAST_TIMEOUT": "30",
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def test_the_survivors_of_a_kill_restore_the_last_commit_and_finish_with_one_process_weights(tmp_path: Path) -> None:
    done, records = _fast_run(tmp_path, "2@1.3", restarts=0)
    assert sorted(records) == [0, 1, 3], done.stderr
    expected = script.reference()
    for record in records.values():
        assert record["size"] == 3 and record["resets"] == [3] and record["epoch"] == script.EPOCHS - 1
        np.testing.assert_allclose(record["w"], expected, rtol=0, atol=1e-12)
    assert "lost rank(s) [2]; 3 rank(s) go on from the last commit" in done.stderr
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["survived"] is True and [e["rank"] for e in run["lost_ranks"]] == [2]


def test_a_new_process_takes_the_lost_ranks_place_and_syncs_from_the_survivors(tmp_path: Path) -> None:
    done, records = _fast_run(tmp_path, "0@1.1", restarts=1)  # rank 0 lost: never sync from the newcomer
    assert sorted(records) == [0, 1, 2, 3], done.stderr
    assert [n for n, r in records.items() if r["replacement"]] == [0]
    expected = script.reference()
    for number, record in records.items():
        assert record["size"] == 4 and record["resets"] == ([] if number == 0 else [4])
        np.testing.assert_allclose(record["w"], expected, rtol=0, atol=1e-12)
