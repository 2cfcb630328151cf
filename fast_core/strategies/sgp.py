"""Stochastic Gradient Push (Assran et al. 2019): push-sum gossip, exact on directed and time-varying graphs.

Row-stochastic averaging over a directed graph converges to a weighted mean that favours well-connected ranks.
Push-sum instead has every rank hand out all of its mass (column-stochastic P) together with a weight that
tracks how much mass it holds; the ratio z_i = x_i / w_i then converges to the true average.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from fast_core.compression import ParameterWire, parameter_codec
from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.topology import Topology, make_topology
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@dataclass(frozen=True)
class _Round:
    """What one rank does in one phase of the topology: whom it pushes to, whom it hears from, its share."""

    dests: tuple[int, ...]
    sources: tuple[int, ...]
    recvs: tuple[np.ndarray, ...]
    share: float  # 1 / (out_degree + 1): the fraction of mass kept and the fraction sent to each out-neighbour


@registered
class SGP(Strategy):
    """Push-sum SGD: x_i <- p_i (x_i + delta_i) + sum_j p_j (x_j + delta_j), w_i <- p_i w_i + sum_j p_j w_j.

    The model holds the de-biased z_i = x_i / w_i: gradients are taken there and users read it. The optimizer
    step turns z_i into z_i + delta_i (delta_i = -eta g_i for SGD), and SGP applies the same delta_i, unscaled, to
    the numerator x_i before pushing, as the paper does. Each rank splits its mass equally among itself and its
    out-neighbours at that step (p_i = 1 / (out_degree_i + 1)), so only the graph's edges matter, not its weights.
    The numerator and the weight travel as one message of layout.size + 1 values (weight last).

    The push is synchronous: the message holds the parameters after the optimizer step, so it cannot overlap
    the gradient computation of the same step.

    ``compress``: the codec the numerator travels in ("fp16", "bf16", "int8"; ``fast_core.compression``); the
    weight always travels exactly, so the ratio x / w divides by the true mass. Each rank keeps its own share
    exact and adds its neighbours' decoded shares: the rounding enters x, as it enters D-PSGD's mixing.
    """

    name = "sgp"

    def __init__(self, topology: str | Topology | nx.Graph = "exp1", compress: str | None = "none") -> None:
        if isinstance(topology, str):
            make_topology(topology, 1)  # an unknown name fails here, with a suggestion, not at the first step
        elif not isinstance(topology, Topology | nx.Graph):
            raise ConfigError(
                "SGP topology must be a topology name like 'exp1', a Topology or a networkx graph, "
                f"got {type(topology).__name__}"
            )
        self.topology = topology
        self.compress = "none" if compress is None else str(compress)  # a strategy string's none: None
        self._codec = parameter_codec(compress, "sgp")

    # state ----------------------------------------------------------------------------------------------------
    @property
    def numerator(self) -> np.ndarray:
        """x_i, a view into this rank's state (read it, do not write it)."""
        return self._state[:-1]

    @property
    def weight(self) -> float:
        """w_i, the push-sum weight (1 on every rank at the start; the weights always sum to the job size)."""
        return float(self._state[-1])

    # hooks ----------------------------------------------------------------------------------------------------
    def setup(self, ctx: StepContext) -> None:
        self._graph = make_topology(self.topology, ctx.size)
        layout = ctx.layout
        # [x_i..., w_i] in one buffer: it is scaled by p_i and sent as is, then the receives are added to it
        self._state = np.empty(layout.size + 1, dtype=layout.dtype)
        self.reset(ctx)
        self._wire = ParameterWire(self._codec, exact_tail=1)  # the weight, last, is never rounded
        received: dict[int, np.ndarray] = {}
        self._rounds: list[_Round] = []
        for phase in range(self._graph.period):
            sources = tuple(self._graph.in_neighbors(ctx.rank, phase))
            dests = tuple(self._graph.out_neighbors(ctx.rank, phase))
            for peer in sources:
                if peer not in received:  # one buffer per peer, shared by every phase it sends in
                    received[peer] = np.empty_like(self._state)
            recvs = tuple(received[peer] for peer in sources)
            self._rounds.append(_Round(dests, sources, recvs, 1.0 / (len(dests) + 1)))

    def reset(self, ctx: StepContext) -> None:
        """The push-sum state restarts at the parameters now in place with weight 1 (nothing is in flight between
        steps): the old numerator and weight would otherwise turn them back into the old de-biased values."""
        self._state[:-1] = ctx.model.params()
        self._state[-1] = 1.0

    def after_step(self, ctx: StepContext) -> None:
        state, x = self._state, self._state[:-1]
        params = ctx.model.params()  # z_i + delta_i
        check_own(ctx, params)
        # x_i + delta_i = x_i - z_i + (z_i + delta_i) = (1 - 1/w_i) x_i + params, with no buffer for delta_i
        x *= 1.0 - 1.0 / state[-1]
        axpy(1.0, params, x)
        plan = self._rounds[ctx.round % len(self._rounds)]
        if plan.dests or plan.sources:
            state *= plan.share
            self._wire.exchange_and_wait(
                ctx.engine, state, plan.dests, plan.recvs, plan.sources, Tag.PUSH_SUM, ctx.round
            )
            for peer, buf in zip(plan.sources, plan.recvs, strict=True):  # the sends are complete: state may change
                if not refused(ctx, peer, buf):  # NaN/Inf mass is dropped whole (x and w): x / w stays an average
                    axpy(1.0, buf, state)
        np.divide(x, state[-1], out=params)
        ctx.model.set_params(params)
