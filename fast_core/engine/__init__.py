"""Messaging engines: MPI across processes and machines, LocalCluster threads inside one process."""

from __future__ import annotations

from .base import DEFAULT_TIMEOUT, Engine, Request
from .local import LocalCluster, LocalEngine


def mpi_engine(comm=None, timeout: float | None = None) -> Engine:
    """An MPIEngine over ``comm`` (COMM_WORLD by default); imports mpi4py only when called."""
    from .mpi import MPIEngine

    return MPIEngine(comm, timeout)


def launched_under_mpi() -> bool:
    """True when this process was started by an MPI launcher (mpiexec/mpirun/srun) with more than one rank."""
    import os

    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"):
        if var in os.environ:
            try:
                return int(os.environ[var]) > 1
            except ValueError:
                return False
    return False


__all__ = ["DEFAULT_TIMEOUT", "Engine", "LocalCluster", "LocalEngine", "Request", "launched_under_mpi", "mpi_engine"]
