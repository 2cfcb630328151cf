"""D-PSGD (Lian et al. 2017): synchronous averaging of parameters with the neighbours of a topology."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import ParameterWire, parameter_codec
from fast_core.engine import Request
from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.cost import CostProfile, neighbour_exchange
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.topology import Topology, is_column_stochastic, make_topology
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@registered
class DPSGD(Strategy):
    """x_i <- sum_j w_ij x_j + delta_i, where delta_i is what the optimizer did to x_i this step (-eta g_i for SGD).

    The parameters x_j of the start of step k are sent as soon as step k-1's mixing is done, so the exchange runs
    while step k computes its gradient; after the optimizer step the worker waits for its neighbours and mixes.

    ``compress``: the codec the parameters travel in (``fast_core.compression``: "fp16", "bf16", "int8"; "none"
    sends them as they are). The neighbours mix the decoded values, each worker its own exact ones, so the
    quantisation error (a relative 2^-11, 2^-8, or half a step of 1/127 of a block's largest value) enters the
    mixing.

    ``qgm``: quasi-global momentum (Lin et al. 2021) with factor beta, for shards that are not identically
    distributed, with the user's optimizer plain SGD (no momentum of its own). Local momentum there accumulates each
    shard's own direction; QGM's buffer M accumulates what the worker actually moved, mixing included:
    x_i <- sum_j w_ij x_j + delta_i - beta M_i, then M_i <- beta M_i + (1 - beta)(x_i^old - x_i^new)
    (in parameter units: M is lr times the paper's buffer, so no learning rate is needed here). 0: off.

    Sparsifying codecs (top-k, random-k) are refused: zeros in place of parameters would pull every model
    toward 0; they need compressed differences: CHOCO-SGD (``choco``).
    """

    name = "dpsgd"

    def __init__(
        self,
        topology: str | Topology = "ring",
        weights: str = "uniform",
        compress: str | None = "none",
        qgm: float = 0.0,
    ) -> None:
        self.topology = topology
        self.weights = weights
        self.compress = "none" if compress is None else str(compress)  # a strategy string's none: None
        self._codec = parameter_codec(compress, "dpsgd")
        if isinstance(qgm, bool) or not isinstance(qgm, int | float) or not 0 <= qgm < 1:
            raise ConfigError(
                f"dpsgd's qgm (quasi-global momentum) must be in [0, 1), got {qgm!r}; e.g. dpsgd:ring,qgm=0.9"
            )
        self.qgm = float(qgm)

    def cost_profile(self, size: int) -> CostProfile:
        """Its model to each out-neighbour, posted after the step so it travels during the next one's compute."""
        return neighbour_exchange(self.topology, size, "overlaps")

    def setup(self, ctx: StepContext) -> None:
        self._graph = make_topology(self.topology, ctx.size, weights=self.weights)
        if ctx.rank == 0 and not all(
            is_column_stochastic(self._graph.mixing_matrix(k)) for k in range(self._graph.period)
        ):
            warnings.warn(
                f"D-PSGD on {self._graph!r}: its mixing matrix is not column stochastic, so workers agree on a "
                "weighted, not the true, average; use weights='metropolis' on an undirected graph, or 'sgp' (push-sum) "
                "on a directed one",
                stacklevel=2,
            )
        self._start = ctx.layout.empty()  # own parameters at the start of the step, also the send buffer
        self._received: dict[int, np.ndarray] = {}
        self._wire = ParameterWire(self._codec)
        self._requests: list[Request] = []
        self._momentum = np.zeros_like(self._start) if self.qgm else None
        self._post(ctx, ctx.round)

    def _buffer(self, ctx: StepContext, peer: int) -> np.ndarray:
        if peer not in self._received:
            self._received[peer] = ctx.layout.empty()
        return self._received[peer]

    def _post(self, ctx: StepContext, step: int) -> None:
        np.copyto(self._start, ctx.model.params())
        sources = self._graph.in_neighbors(ctx.rank, step)
        dests = self._graph.out_neighbors(ctx.rank, step)
        recvs = [self._buffer(ctx, peer) for peer in sources]
        self._requests = self._wire.exchange(ctx.engine, self._start, dests, recvs, sources, Tag.PARAMETERS)
        self._round = step

    def after_step(self, ctx: StepContext) -> None:
        ctx.engine.wait_all(self._requests)
        self._wire.finish()
        params = ctx.model.params()
        check_own(ctx, params)
        rank, step = ctx.rank, self._round
        weights = self._graph.in_weights(rank, step)
        # a neighbour's NaN/Inf parameters are refused: its weight stays with this worker for the step
        heard = {peer: w for peer, w in weights.items() if not refused(ctx, peer, self._received[peer])}
        own = self._graph.self_weight(rank, step) + sum(w for peer, w in weights.items() if peer not in heard)
        # params = x_i + delta_i  ->  w_ii x_i + sum_j w_ij x_j + delta_i
        axpy(own - 1.0, self._start, params)
        for peer, weight in heard.items():
            axpy(weight, self._received[peer], params)
        if self._momentum is not None:
            self._quasi_global_momentum(params)
        ctx.model.set_params(params)
        self._post(ctx, step + 1)

    def _quasi_global_momentum(self, params: np.ndarray) -> None:
        """params -= beta M; then M <- beta M + (1 - beta)(x_start - params): what this step moved, mixing included."""
        beta, momentum = self.qgm, self._momentum
        axpy(-beta, momentum, params)
        momentum *= beta
        axpy(1.0 - beta, self._start, momentum)
        axpy(beta - 1.0, params, momentum)

    def close(self, ctx: StepContext) -> None:
        ctx.engine.wait_all(self._requests)
        self._requests = []
