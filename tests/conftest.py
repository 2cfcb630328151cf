"""Shared test set-up: the tests folder on sys.path, the running test known to ``mpirun.run_mpi``, and a fresh run
configuration for each test."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mpirun  # noqa: E402

from fast_core.config.current import forget_run_config  # noqa: E402


@pytest.fixture(autouse=True)
def _current_test(request: pytest.FixtureRequest):
    """Let run_mpi compare its own timeout with the one pytest-timeout enforces on this test."""
    mpirun.CURRENT_TEST = request.node
    yield
    mpirun.CURRENT_TEST = None


@pytest.fixture(autouse=True)
def _each_test_reads_its_own_run_configuration():
    """A process reads its run configuration once (``fast_core.run_config()``); each test plays a new process, with
    the FAST_* variables it set."""
    forget_run_config()
    yield
    forget_run_config()
