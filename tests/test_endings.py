"""Clear endings where survival is impossible (issue 13, point 5): a lost rank is named, a dead-peer diagnosis never
crashes, one in-process worker's exception stops the others at once, a stopped launch leaves no process behind.

Every fault here is real (an exception raised on one worker, a rank killed with SIGKILL). Time bounds are generous
(a loaded 2-core machine): they tell an ending at once from one after a timeout, never a speed.
"""

from __future__ import annotations

from mpirun import TESTS, run_mpi

import pytest


@pytest.mark.mpi
def test_the_mpi_diagnosis_of_a_timed_out_collective_names_ranks_and_never_crashes() -> None:
    out = run_mpi(3, TESTS / "endings_mpi.py", timeout=120)
    for check in ("ranks_in_other_collectives", "an_absent_rank", "a_timed_out_allreduce_names_the_rank"):
        assert f"{check} ok" in out, out
