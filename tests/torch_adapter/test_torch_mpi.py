"""fast_torch under a real mpiexec -n 4: every strategy on the example's CNN, and the example itself.

Each launch pays the torch import on every rank (about 2.6 s each, 4 ranks on 2 cores), so all strategies share
one launch (tests/torch_adapter/torch_cases.py). ``mpirun`` is importable through tests/conftest.py, which pytest
loads for this subdirectory too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mpirun import run_mpi
from strategy_comparison import check_comparison_output

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent.parent / "examples"


@pytest.mark.mpi
def test_every_strategy_is_within_two_points_of_allreduce_through_fast_torch() -> None:
    # 15 epochs each. Measured (4 ranks, 2 cores): all-reduce 0.9889 (deterministic); localsgd, dpsgd, sgp, adpsgd,
    # easgd and gossip 0.9944-0.9972; async:torus 0.9889-0.9972 over 11 runs, with staleness=1 0.9750-0.9861. Run
    # but not compared (reasons in tests/strategy_comparison.py): fast:torus 0.58, 0.63, 0.72, 0.77, 0.78, 0.86, 0.90
    # (reset_optimizer=true 0.84, 0.91; synchronous=true 0.08, it diverges; at lr 0.0167 and 0.01, a third and a fifth
    # of the others' rate, it reached 0.95-0.99) and async:torus,remix_stale=true 0.9583-0.9861 over 31 runs (mean
    # staleness 2.6 steps, max 18: 4 ranks share 2 cores).
    output = run_mpi(4, HERE / "torch_cases.py", timeout=240)  # a failure makes the job exit nonzero: run_mpi fails
    check_comparison_output(output)


@pytest.mark.mpi
def test_torch_example_learns_on_four_ranks() -> None:
    # D-PSGD on the ring is synchronous and seeded: on the digits, 3 epochs gave 0.9611 in each of 14 runs here.
    output = run_mpi(4, EXAMPLES / "torch_mnist1d.py", "--data", "digits", "--epochs", "3", timeout=120)
    accuracy = float(re.search(r"test accuracy of the averaged model: ([0-9.]+)", output).group(1))
    assert accuracy > 0.9, output
    assert "4 workers" in output
    assert len(re.findall(r"^epoch +\d+  loss [0-9.]+  consensus distance ", output, re.MULTILINE)) == 3, output
