"""Messaging engines: MPI across processes and machines, LocalCluster threads inside one process."""

from __future__ import annotations

import os
import sys

from .base import DEFAULT_TIMEOUT, Engine, Request
from .local import LocalCluster, LocalEngine

_LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")


def mpi_engine(comm=None, timeout: float | None = None) -> Engine:
    """An MPIEngine over ``comm`` (COMM_WORLD by default); imports mpi4py only when called."""
    from .mpi import MPIEngine

    return MPIEngine(comm, timeout)


def launched_under_mpi() -> bool:
    """True when this process was started by an MPI launcher (mpiexec/mpirun/srun) with more than one rank."""
    for var in _LAUNCHER_SIZE_VARIABLES:
        if var in os.environ:
            try:
                return int(os.environ[var]) > 1
            except ValueError:
                return False
    return False


def default_engine(timeout: float | None = None) -> Engine:
    """A new engine for this process: MPI when started by an MPI launcher, else a single local worker.

    A script started without a launcher still runs (as one worker) and says so on stderr. Scripts call
    ``fast_core.init()`` instead, which makes this engine once per process and shares it.
    """
    if launched_under_mpi():
        return mpi_engine(timeout=timeout)
    print(
        "fast: not started by an MPI launcher, running as a single worker "
        "(use `mpiexec -n 4 python -m mpi4py script.py` for 4 workers)",
        file=sys.stderr,
    )
    return LocalCluster(1, timeout=timeout).engine(0)


__all__ = [
    "DEFAULT_TIMEOUT",
    "Engine",
    "LocalCluster",
    "LocalEngine",
    "Request",
    "default_engine",
    "launched_under_mpi",
    "mpi_engine",
]
