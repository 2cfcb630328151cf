"""FAST core: topologies, flat parameter buffers, engines, strategies and the Worker. No framework imports."""

from __future__ import annotations

import logging
import sys

from .contract import ModelAdapter
from .engine import Engine, LocalCluster, LocalEngine, launched_under_mpi, mpi_engine
from .errors import ConfigError, FastError, MessageError, ModelMismatchError, PeerFailed, PeerTimeout
from .flat import FlatLayout
from .strategies import (
    ADPSGD,
    DPSGD,
    EASGD,
    FAST,
    SGP,
    AllReduce,
    AsyncAveraging,
    Every,
    Gossip,
    LocalSGD,
    Schedule,
    Strategy,
    make_strategy,
    warmup,
)
from .topology import Topology, TopologyError, make_topology
from .worker import Worker

__version__ = "0.1.0"

log = logging.getLogger("fast")


def init(timeout: float | None = None) -> Engine:
    """The engine for this process: MPI when started by an MPI launcher, else a single local worker.

    A script started without a launcher still runs (as one worker) and says so once on stderr.
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
    "ADPSGD",
    "DPSGD",
    "EASGD",
    "FAST",
    "SGP",
    "AllReduce",
    "AsyncAveraging",
    "Every",
    "Gossip",
    "LocalSGD",
    "Schedule",
    "ConfigError",
    "Engine",
    "FastError",
    "FlatLayout",
    "LocalCluster",
    "LocalEngine",
    "MessageError",
    "ModelAdapter",
    "ModelMismatchError",
    "PeerFailed",
    "PeerTimeout",
    "Strategy",
    "Topology",
    "TopologyError",
    "Worker",
    "init",
    "make_strategy",
    "make_topology",
    "mpi_engine",
    "warmup",
]
