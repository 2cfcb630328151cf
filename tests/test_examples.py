"""The README's main job, run as the README says (4 MPI ranks), on fewer epochs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mpirun import run_mpi

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["dpsgd:ring", "allreduce"])
def test_numpy_digits_example_learns_on_four_ranks(strategy: str) -> None:
    output = run_mpi(4, EXAMPLES / "numpy_digits.py", "--strategy", strategy, "--epochs", "8")
    accuracy = float(re.search(r"test accuracy of the averaged model: ([0-9.]+)", output).group(1))
    assert accuracy > 0.9, output
    assert "4 workers" in output
