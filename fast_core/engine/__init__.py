"""Messaging engines: MPI across processes and machines, LocalCluster threads inside one process."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from fast_core.config.run import FAULT_TOLERANT_VARIABLE
from fast_core.engine.base import DEFAULT_TIMEOUT, Engine, Request
from fast_core.engine.capabilities import FaultTolerant, Metered, VirtualTime
from fast_core.engine.local import LocalCluster, LocalEngine
from fast_core.errors import ConfigError

_LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")


def mpi_engine(
    comm=None, timeout: float = DEFAULT_TIMEOUT, fault_tolerant: bool = False, max_restarts: int = 0, max_ranks: int = 0
) -> Engine:
    """An MPIEngine over ``comm`` (COMM_WORLD by default) waiting ``timeout`` seconds for a peer; imports mpi4py only
    when called.

    ``fault_tolerant`` (the run configuration's FAST_FAULT_TOLERANT, which ``fast run --fault-tolerant`` sets): the
    FaultTolerantMPIEngine instead, which survives a lost rank, replaces up to ``max_restarts`` of them
    (FAST_MAX_RESTARTS) and grows to ``max_ranks`` when workers ask to join (FAST_MAX_RANKS); it needs Open MPI
    with ULFM started with ``--with-ft ulfm``, and any other MPI is refused on every rank (each is given the same
    configuration)."""
    if not fault_tolerant:
        from fast_core.engine.mpi import MPIEngine

        return MPIEngine(comm, timeout=timeout)
    from fast_core.engine.mpi import _mpi

    MPI = _mpi()
    problem = ulfm_problem(MPI.Get_library_version(), os.environ)
    if problem:
        rank = MPI.COMM_WORLD.Get_rank()
        raise ConfigError(
            f"rank {rank}: {FAULT_TOLERANT_VARIABLE}=1 needs Open MPI with ULFM under `mpiexec --with-ft ulfm`, but "
            f"{problem}; launch with `fast run --fault-tolerant` (which needs pip install 'fast-training[mpi-ft]')"
        )
    from fast_core.engine.mpi_ft import FaultTolerantMPIEngine

    return FaultTolerantMPIEngine(comm, timeout=timeout, max_restarts=max_restarts, max_ranks=max_ranks)


def ulfm_problem(library_version: str, env: Mapping[str, str]) -> str | None:
    """Why this process cannot survive a lost rank, or None: the MPI library loaded must be Open MPI (``MPI_Get_
    library_version``), started with ULFM's recovery on (mpiexec --with-ft ulfm sets OMPI_MCA_mpi_ft_enable)."""
    text = library_version.strip()
    first = " ".join(text.splitlines()[0].split()) if text else "an unknown MPI library"
    if not first.startswith("Open MPI"):
        return f"the MPI library loaded is {first.split(',')[0]}"
    if env.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() not in ("1", "true", "yes", "enabled"):
        return f"{first.split(',')[0]} was started without --with-ft ulfm (OMPI_MCA_mpi_ft_enable is not set)"
    return None


def launched_under_mpi(fault_tolerant: bool = False) -> bool:
    """True when this process was started by an MPI launcher (mpiexec/mpirun/srun) with more than one rank, or
    by any MPI launcher in a ``fault_tolerant`` job (a replacement a survivor spawned is alone in its own launch)."""
    for var in _LAUNCHER_SIZE_VARIABLES:
        if var in os.environ:
            try:
                return int(os.environ[var]) > 1 or fault_tolerant
            except ValueError:
                return False
    return False


def default_engine(
    timeout: float = DEFAULT_TIMEOUT, fault_tolerant: bool = False, max_restarts: int = 0, max_ranks: int = 0
) -> Engine:
    """A new engine for this process, from the numbers given (``fast_core.init()`` gives the run configuration's):
    MPI when started by an MPI launcher, else a single local worker.

    A script started without a launcher still runs (as one worker) and says so on stderr. Scripts call
    ``fast_core.init()`` instead, which makes this engine once per process and shares it.
    """
    if launched_under_mpi(fault_tolerant):
        return mpi_engine(
            timeout=timeout, fault_tolerant=fault_tolerant, max_restarts=max_restarts, max_ranks=max_ranks
        )
    print(
        "fast: not started by an MPI launcher, running as a single worker "
        "(use `mpiexec -n 4 python -m mpi4py script.py` for 4 workers)",
        file=sys.stderr,
    )
    return LocalCluster(1, timeout=timeout).engine(0)


__all__ = [
    "DEFAULT_TIMEOUT",
    "Engine",
    "FaultTolerant",
    "LocalCluster",
    "LocalEngine",
    "Metered",
    "Request",
    "VirtualTime",
    "default_engine",
    "launched_under_mpi",
    "mpi_engine",
    "ulfm_problem",
]
