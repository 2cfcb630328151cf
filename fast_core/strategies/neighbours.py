"""One blocking round of neighbour mixing, v_i <- sum_j w_ij v_j, for a buffer that is not simply the parameters.

Gradient tracking mixes its trackers and its parameters this way, decentralized DiLoCo its pseudo-gradients: the
same exchange, weights and refusal of a neighbour's NaN/Inf, written once here (D-PSGD overlaps its exchange with
the next step instead, so it posts and mixes on its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.model.mixing import axpy
from fast_core.strategies.integrity import refused

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext
    from fast_core.topology import Topology


class NeighbourMix:
    """Mixes any contiguous float buffer of at most the model's size over ``graph`` (a fragment of the parameter
    vector too), reusing one send and one receive buffer per neighbour across rounds."""

    def __init__(self, graph: Topology) -> None:
        self.graph = graph
        self._sent: np.ndarray | None = None
        self._received: dict[int, np.ndarray] = {}

    def _space(self, ctx: StepContext, peer: int | None, size: int) -> np.ndarray:
        """The first ``size`` values of a model-sized buffer (the send buffer for ``peer=None``)."""
        if peer is None:
            if self._sent is None:
                self._sent = ctx.layout.empty()
            return self._sent[:size]
        if peer not in self._received:
            self._received[peer] = ctx.layout.empty()
        return self._received[peer][:size]

    def __call__(self, ctx: StepContext, own: np.ndarray, round_: int, what: str, tag: int) -> np.ndarray:
        """sum_j w_ij v_j for v_i = ``own`` (replaced in place and returned) over the graph of round ``round_``;
        a neighbour whose values hold NaN/Inf is refused and its weight stays with this worker."""
        graph, rank, size = self.graph, ctx.rank, own.size
        sources = graph.in_neighbors(rank, round_)
        recvs = [self._space(ctx, peer, size) for peer in sources]
        sent = self._space(ctx, None, size)
        np.copyto(sent, own)
        ctx.engine.wait_all(ctx.engine.exchange(sent, graph.out_neighbors(rank, round_), recvs, sources, tag))
        weights = graph.in_weights(rank, round_)
        heard = {peer: w for peer, w in weights.items() if not refused(ctx, peer, self._space(ctx, peer, size), what)}
        own *= graph.self_weight(rank, round_) + sum(w for peer, w in weights.items() if peer not in heard)
        for peer, weight in heard.items():
            axpy(weight, self._space(ctx, peer, size), own)
        return own
