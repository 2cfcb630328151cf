"""The training strategies, each written once against the Worker and the engine protocol."""

from .allreduce import AllReduce
from .base import Strategy
from .dpsgd import DPSGD
from .spec import STRATEGIES, make_strategy, parse_strategy

__all__ = ["DPSGD", "STRATEGIES", "AllReduce", "Strategy", "make_strategy", "parse_strategy"]
