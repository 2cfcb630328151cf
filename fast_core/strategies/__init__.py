"""The training strategies, each written once against the narrow StepContext and the engine protocol.

FAST, Gossip and EASGD each name a family: the constructor builds the synchronous or the asynchronous class
(``SyncFAST``/``AsyncFAST``, ``SyncGossip``/``AsyncGossip``, ``SyncEASGD``/``AsyncEASGD`` under EASGD's ``Every``);
the parameter server ``ParameterServer`` builds ``SyncPS`` or ``AsyncPS`` from its ``mode``.

Each class registers its name (registry.py); a strategy string is read once into a ``StrategySpec`` (spec.py) that
builds it, and a built strategy is described by its canonical text (canonical.py). Each answers ``fast model``'s
questions itself (``Strategy.cost_profile``, cost.py).
"""

from fast_core.strategies.adpsgd import ADPSGD
from fast_core.strategies.allreduce import AllReduce
from fast_core.strategies.async_avg import AsyncAveraging
from fast_core.strategies.base import Strategy
from fast_core.strategies.choco import CHOCO
from fast_core.strategies.compose import Every, Schedule, warmup
from fast_core.strategies.diloco import DiLoCo
from fast_core.strategies.dpsgd import DPSGD
from fast_core.strategies.easgd import EASGD, SyncEASGD
from fast_core.strategies.easgd_async import AsyncEASGD
from fast_core.strategies.fast import FAST, SyncFAST
from fast_core.strategies.fast_async import AsyncFAST
from fast_core.strategies.gossip import Gossip, SyncGossip
from fast_core.strategies.gossip_async import AsyncGossip
from fast_core.strategies.local_sgd import LocalSGD, ParameterAverage
from fast_core.strategies.ps import ParameterServer, SyncPS
from fast_core.strategies.ps_async import AsyncPS
from fast_core.strategies.sgp import SGP
from fast_core.strategies.spec import STRATEGIES, StrategySpec, make_strategy, parse_strategy
from fast_core.strategies.tracking import GradientTracking

__all__ = [
    "ADPSGD",
    "CHOCO",
    "DPSGD",
    "EASGD",
    "FAST",
    "SGP",
    "STRATEGIES",
    "AllReduce",
    "AsyncAveraging",
    "AsyncEASGD",
    "AsyncFAST",
    "AsyncGossip",
    "AsyncPS",
    "DiLoCo",
    "Every",
    "Gossip",
    "GradientTracking",
    "LocalSGD",
    "ParameterAverage",
    "ParameterServer",
    "Schedule",
    "Strategy",
    "StrategySpec",
    "SyncEASGD",
    "SyncFAST",
    "SyncGossip",
    "SyncPS",
    "make_strategy",
    "parse_strategy",
    "warmup",
]
