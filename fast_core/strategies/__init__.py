"""The training strategies, each written once against the Worker and the engine protocol."""

from .adpsgd import ADPSGD
from .allreduce import AllReduce
from .async_avg import AsyncAveraging
from .base import Strategy
from .compose import Every, Schedule, warmup
from .dpsgd import DPSGD
from .easgd import EASGD
from .fast import FAST
from .gossip import Gossip
from .local_sgd import LocalSGD
from .sgp import SGP
from .spec import STRATEGIES, make_strategy, parse_strategy

__all__ = [
    "ADPSGD",
    "DPSGD",
    "EASGD",
    "FAST",
    "SGP",
    "STRATEGIES",
    "AllReduce",
    "AsyncAveraging",
    "Every",
    "Gossip",
    "LocalSGD",
    "Schedule",
    "Strategy",
    "make_strategy",
    "parse_strategy",
    "warmup",
]
