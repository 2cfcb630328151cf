"""The Flax MNIST example: a plain Flax script plus at most 5 lines, learning on 2 MPI ranks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from mpirun import run_mpi

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flax_mnist.py"


def test_the_example_is_a_plain_flax_script_plus_five_lines_at_most() -> None:
    lines = EXAMPLE.read_text().splitlines()
    marked = [line for line in lines if "  # FAST" in line]  # code lines with the comment
    assert 1 <= len(marked) <= 5, marked
    plain = ast.parse("\n".join(line for line in lines if line not in marked))  # still a whole script
    names = {node.id for node in ast.walk(plain) if isinstance(node, ast.Name)}
    assert "fast" not in names and "train_step" in names and "main" in names


@pytest.mark.mpi
def test_flax_mnist_learns_on_two_ranks() -> None:
    output = run_mpi(2, EXAMPLE, timeout=240)
    accuracies = [float(a) for a in re.findall(r"test accuracy ([0-9.]+)", output)]
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1], output  # both ranks test the consensus model
    assert accuracies[0] > 0.85, output
