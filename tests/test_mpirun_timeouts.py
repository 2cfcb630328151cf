"""run_mpi never asks for more time than pytest-timeout gives the test: otherwise pytest-timeout kills the test first
and the launch's own timeout (and the job's output) is silently lost, as the tf env's 4-rank test once was."""

from __future__ import annotations

import pytest
from mpirun import MARGIN, check_fits_test_timeout, pytest_timeout_of


def test_the_default_limit_is_read_from_the_ini(request: pytest.FixtureRequest) -> None:
    assert pytest_timeout_of(request.node) == 300.0
    assert check_fits_test_timeout(None) == 300.0 - MARGIN


def test_a_launch_longer_than_the_test_limit_fails_naming_the_mark() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"pytest.mark.timeout\(495\)"):
        check_fits_test_timeout(480)


@pytest.mark.timeout(500)
def test_a_marked_test_may_launch_for_longer(request: pytest.FixtureRequest) -> None:
    assert pytest_timeout_of(request.node) == 500.0
    assert check_fits_test_timeout(480) == 480
