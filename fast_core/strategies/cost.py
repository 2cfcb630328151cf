"""What one step of a strategy sends, as ``fast model`` asks it (fast_core.perfmodel.predict).

Each strategy answers for itself (``Strategy.cost_profile(size)``) in machine-free terms; the model prices the
answer with a machine's latency, bandwidths and all-reduce algorithm. A strategy that answers None is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from fast_core.topology import Topology, make_topology

Timing = Literal["waits", "overlaps", "background"]


@dataclass(frozen=True)
class CostProfile:
    """One exchange of a strategy on ``size`` ranks: what crosses the busiest link, how often, and who waits."""

    allreduce: bool = False
    """The exchange is one all-reduce of the model (priced by the link model's algorithm)."""
    rounds: int = 0
    """Otherwise: rounds of messages, each paying one latency (push then pull: 2)."""
    models_per_round: float = 0.0
    """Model-sized payloads through the busiest link in one round, one after another (a rank's neighbours, a
    server's shares of the workers' models)."""
    period: int = 1
    """Steps per exchange (local SGD's H, EASGD's tau, ``every=k``): its cost is spread over them."""
    timing: Timing = "waits"
    """waits: the step waits for the exchange; overlaps: the exchange runs during the next step's compute;
    background: a communication thread carries it, off the training loop."""
    mixing_copies: int = 0
    """Model-sized vectors the mixing moves through memory (D-PSGD's d neighbours, its own model and the result)."""

    def every(self, k: int) -> CostProfile:
        """The same exchange made on one step in ``k``."""
        return replace(self, period=self.period * k)


def neighbour_exchange(topology: str | Topology, size: int, timing: Timing) -> CostProfile:
    """A rank sends its model to each of its out-neighbours in ``topology`` (in a row on its link) and mixes what
    it receives with its own."""
    degree = len(make_topology(topology, size).out_neighbors(0, 0))
    return CostProfile(rounds=1, models_per_round=degree, timing=timing, mixing_copies=degree + 2)
