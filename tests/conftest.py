"""Shared test set-up: the tests folder on sys.path, and the running test known to ``mpirun.run_mpi``."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mpirun  # noqa: E402


@pytest.fixture(autouse=True)
def _current_test(request: pytest.FixtureRequest):
    """Let run_mpi compare its own timeout with the one pytest-timeout enforces on this test."""
    mpirun.CURRENT_TEST = request.node
    yield
    mpirun.CURRENT_TEST = None
