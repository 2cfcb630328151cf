"""Launch a script under mpiexec for a test, with a timeout, and return its output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CURRENT_TEST: pytest.Item | None = None
"""The test being run (set by conftest.py): its pytest-timeout limit bounds the timeouts asked for here."""

MARGIN = 15.0
"""Seconds a launch's own timeout leaves under the test's limit, for start-up and the test's own checks."""


def mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if found is None:
        pytest.fail("mpiexec not found: install the mpi extra (pip install 'fast-training[mpi]')")
    return found


def run_mpi(ranks: int, script: str | Path, *args: str, timeout: float | None = None) -> str:
    """Run ``python -m mpi4py script args`` on ``ranks`` ranks; fail the test with the output on error.

    ``timeout`` must fit inside the test's own pytest-timeout limit (the ``timeout`` ini option, or the test's
    ``@pytest.mark.timeout``): otherwise pytest-timeout would kill the test first, silently overriding it, and the
    job's output would be lost. Such a test fails at once, saying which mark to add. None: the test's limit less
    a margin (285 s under the default 300)."""
    timeout = check_fits_test_timeout(timeout)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", str(script), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} timed out after {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def pytest_timeout_of(item: pytest.Item) -> float | None:
    """The seconds pytest-timeout gives ``item``: its ``timeout`` mark, else the ini option (None: no limit)."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        value = mark.args[0] if mark.args else mark.kwargs.get("timeout")
    else:
        value = item.config.getini("timeout")
    return float(value) if value not in (None, "", 0, "0") else None


def check_fits_test_timeout(timeout: float | None) -> float:
    """``timeout``, or the running test's limit less the margin when None; fails the test when it does not fit."""
    limit = pytest_timeout_of(CURRENT_TEST) if CURRENT_TEST is not None else None
    if timeout is None:
        return limit - MARGIN if limit is not None else 300.0
    if limit is not None and timeout + MARGIN > limit:
        pytest.fail(
            f"run_mpi(timeout={timeout:g}) does not fit this test's pytest timeout of {limit:g} s: "
            f"mark the test @pytest.mark.timeout({int(timeout + MARGIN)}) or shorten the launch"
        )
    return timeout
