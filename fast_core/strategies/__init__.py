"""The training strategies, each written once against the narrow StepContext and the engine protocol.

FAST, Gossip and EASGD each name a family: the constructor builds the synchronous or the asynchronous class
(``SyncFAST``/``AsyncFAST``, ``SyncGossip``/``AsyncGossip``, ``SyncEASGD``/``AsyncEASGD`` under EASGD's ``Every``);
the parameter server ``ParameterServer`` builds ``SyncPS`` or ``AsyncPS`` from its ``mode``.
"""

from .adpsgd import ADPSGD
from .allreduce import AllReduce
from .async_avg import AsyncAveraging
from .base import Strategy
from .choco import CHOCO
from .compose import Every, Schedule, warmup
from .diloco import DiLoCo
from .dpsgd import DPSGD
from .easgd import EASGD, SyncEASGD
from .easgd_async import AsyncEASGD
from .fast import FAST, SyncFAST
from .fast_async import AsyncFAST
from .gossip import Gossip, SyncGossip
from .gossip_async import AsyncGossip
from .local_sgd import LocalSGD, ParameterAverage
from .ps import ParameterServer, SyncPS
from .ps_async import AsyncPS
from .sgp import SGP
from .spec import STRATEGIES, make_strategy, parse_strategy
from .tracking import GradientTracking

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
    "SyncEASGD",
    "SyncFAST",
    "SyncGossip",
    "SyncPS",
    "make_strategy",
    "parse_strategy",
    "warmup",
]
