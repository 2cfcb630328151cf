"""Launch a script under mpiexec for a test, with a timeout, and return its output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        pytest.fail("mpiexec not found: install the mpi extra (pip install 'fast-training[mpi]')")
    return found


def run_mpi(ranks: int, script: str | Path, *args: str, timeout: float = 300) -> str:
    """Run ``python -m mpi4py script args`` on ``ranks`` ranks; fail the test with the output on error."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", str(script), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} timed out after {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout
