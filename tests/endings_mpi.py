"""Run under ``mpiexec -n 3 python -m mpi4py tests/endings_mpi.py``: the MPI engine's diagnosis of a collective that
timed out (tests/test_endings.py). Rank 0 prints one line per check; any failed assertion aborts the job."""

from __future__ import annotations

import time

import numpy as np

from fast_core import mpi_engine
from fast_core.engine import mpi
from fast_core.engine.mpi import MPIEngine
from fast_core.errors import PeerTimeout


def ranks_in_other_collectives(engine) -> None:
    """Ranks 0 and 1 time out in collective #5, rank 2 in #6: each is named, nothing crashes (the answer from
    another collective completes a receive that used to be cancelled after, "Invalid MPI_Request")."""
    sequence = 6 if engine.rank == 2 else 5
    missing, elsewhere = engine._diagnose(sequence)
    assert missing == (), missing
    expected = {0: 5, 1: 5} if engine.rank == 2 else {2: 6}
    assert elsewhere == expected, elsewhere


def an_absent_rank(engine) -> None:
    """Rank 2 comes too late for the diagnosis of ranks 0 and 1: they name it, and only it."""
    if engine.rank == 2:
        time.sleep(mpi._DIAGNOSE_SECONDS + 1)
    missing, elsewhere = engine._diagnose(7)
    if engine.rank != 2:
        assert missing == (2,) and elsewhere == {}, (missing, elsewhere)
        engine.comm.Recv(np.zeros(1, dtype=np.int64), 2, mpi._DIAGNOSE_TAG)  # rank 2's late answer, so MPI can end


def a_timed_out_allreduce_names_the_rank(engine) -> None:
    """The whole path: an allreduce that rank 2 joins late raises PeerTimeout naming rank 2 on ranks 0 and 1."""
    impatient = MPIEngine(engine.comm.Dup(), timeout=60 if engine.rank == 2 else 0.5)  # no stale messages here
    buf = np.ones(4)
    if engine.rank == 2:
        time.sleep(0.5 + mpi._DIAGNOSE_SECONDS + 1)
        impatient.allreduce(buf)  # completes the others' collective, which they have given up on
        return
    try:
        impatient.allreduce(buf)
    except PeerTimeout as exc:
        assert exc.ranks == (2,), exc.ranks
        assert "rank(s) [2], which never joined it" in str(exc), str(exc)
        assert "[-1]" not in str(exc), str(exc)
    else:
        raise AssertionError("the allreduce should have timed out")


def main() -> None:
    engine = mpi_engine(timeout=30)
    mpi._DIAGNOSE_SECONDS = 1.0  # the checks wait out whole diagnoses
    for check in (ranks_in_other_collectives, an_absent_rank, a_timed_out_allreduce_names_the_rank):
        check(engine)
        engine.barrier()
        if engine.rank == 0:
            print(f"{check.__name__} ok", flush=True)


if __name__ == "__main__":
    main()
