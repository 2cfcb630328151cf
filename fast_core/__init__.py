"""FAST core: topologies, flat parameter buffers, engines, strategies and the Worker. No framework imports."""

from __future__ import annotations

import logging

from fast_core.config.current import run_config
from fast_core.config.run import RunConfig
from fast_core.engine import (
    Engine,
    LocalCluster,
    LocalEngine,
    collectives,
    default_engine,
    launched_under_mpi,
    mpi_engine,
)
from fast_core.errors import ConfigError, FastError, MessageError, ModelMismatchError, PeerFailed, PeerLost, PeerTimeout
from fast_core.model.contract import ModelAdapter
from fast_core.model.flat import FlatLayout
from fast_core.observers.base import Observer
from fast_core.runtime import checkpoint
from fast_core.runtime.budget import Budget
from fast_core.runtime.process import init, local_rank, local_size, rank, size
from fast_core.runtime.worker import Worker
from fast_core.strategies import (
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
    StrategySpec,
    make_strategy,
    warmup,
)
from fast_core.strategies.base import StepContext
from fast_core.strategies.spec import resolve_strategy
from fast_core.topology import Topology, TopologyError, make_topology

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
    "StrategySpec",
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
    "run_config",
    "size",
    "warmup",
]
