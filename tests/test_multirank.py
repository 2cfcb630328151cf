"""The multi-rank cases, once in-process on a LocalCluster and once under mpiexec with the MPI engine."""

from __future__ import annotations

import pytest
from cases import CASES
from mpirun import TESTS, run_mpi

from fast_core import LocalCluster


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("name", list(CASES))
def test_case_on_local_cluster(name: str, size: int) -> None:
    LocalCluster(size, timeout=30).run(CASES[name])


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 4])
def test_cases_under_mpiexec(ranks: int) -> None:
    output = run_mpi(ranks, TESTS / "run_cases.py")
    for name in CASES:
        assert f"{name} ok" in output, output
    assert f"mpi cases: {len(CASES)} passed, 0 failed" in output


@pytest.mark.mpi
def test_async_strategies_finish_on_eight_ranks() -> None:
    """Ring, torus and exponential graphs on 8 ranks (more ranks than cores): no deadlock at any stop."""
    output = run_mpi(8, TESTS / "run_cases.py", "case_async_strategies_finish_on_every_topology", timeout=240)
    assert "case_async_strategies_finish_on_every_topology ok" in output, output
