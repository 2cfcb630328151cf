"""FAST core: topologies, flat parameter buffers, engines, strategies and the Worker. No framework imports."""

from __future__ import annotations

import logging

from . import checkpoint, collectives
from .budget import Budget
from .config import RunConfig
from .contract import ModelAdapter
from .engine import Engine, LocalCluster, LocalEngine, default_engine, launched_under_mpi, mpi_engine
from .errors import ConfigError, FastError, MessageError, ModelMismatchError, PeerFailed, PeerLost, PeerTimeout
from .flat import FlatLayout
from .observers import Observer
from .runtime import init, local_rank, local_size, rank, size
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
from .strategies.base import StepContext
from .strategies.spec import resolve_strategy
from .topology import Topology, TopologyError, make_topology
from .worker import Worker

__version__ = "0.1.0"

log = logging.getLogger("fast")

__all__ = [
    "ADPSGD",
    "DPSGD",
    "EASGD",
    "FAST",
    "SGP",
    "AllReduce",
    "AsyncAveraging",
    "Budget",
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
    "Observer",
    "PeerFailed",
    "PeerLost",
    "PeerTimeout",
    "RunConfig",
    "StepContext",
    "Strategy",
    "Topology",
    "TopologyError",
    "Worker",
    "checkpoint",
    "collectives",
    "default_engine",
    "init",
    "local_rank",
    "local_size",
    "launched_under_mpi",
    "make_strategy",
    "make_topology",
    "mpi_engine",
    "rank",
    "resolve_strategy",
    "size",
    "warmup",
]
