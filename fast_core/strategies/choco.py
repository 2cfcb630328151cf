"""CHOCO-SGD (Koloskova, Stich and Jaggi 2019): gossip that converges with messages compressed as hard as top-1%.

Sending compressed *parameters* fails (a top-k parameter vector is mostly zeros, every model is pulled toward 0).
CHOCO sends compressed *differences* instead: each worker i keeps public copies x^_j of itself and of each
neighbour, all workers updating a copy by the same decoded message, so the copies agree everywhere without ever
being sent whole. After the optimizer step (x_i^{+1/2}):

    q_i = Q(x_i^{+1/2} - x^_i)                          sent to the neighbours (only this travels)
    x^_j <- x^_j + q_j                                   for j = i and each neighbour j
    x_i <- x_i^{+1/2} + gamma sum_j w_ij (x^_j - x^_i)   consensus step of size gamma on the public copies

What a message leaves out stays in x_i - x^_i and goes out in later messages (the error feedback is built in).
With ``compress=none`` and ``gamma=1`` it is gossip after the optimizer step, x <- W (x - lr g).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import Codec, TopK, make_codec
from fast_core.engine import Request
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import check_fraction, static_topology
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.topology import Topology
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext

_SEED_STRIDE = 1_000_003
"""Random-k positions of rank r's message at step k come from seed k * stride + r: sender and receivers agree."""


@registered
class CHOCO(Strategy):
    """CHOCO-SGD on a fixed ``topology``: compressed differences (``compress``: any ``fast_core.compression``
    codec, top-10% by default) mixed with consensus step size ``gamma``. Harder compression needs a smaller gamma
    (the paper tunes it per codec); by default 1 for the dense codecs (none, fp16, bf16, int8) and 0.1 for top-k
    and random-k, which on tests/test_choco.py's task learned as D-PSGD does down to top-1% and random-10%."""

    name = "choco"
    needs_equal_start = True  # every public copy starts at this worker's own start: a disagreement is never sent

    def __init__(
        self,
        topology: str | Topology = "ring",
        weights: str = "uniform",
        compress: str | None = "topk:ratio=0.1",
        gamma: float | None = None,
    ) -> None:
        self.topology = topology
        self.weights = weights
        self.compress = compress = "none" if compress is None else str(compress)
        self._codec: Codec | None = None if compress == "none" else make_codec(compress)
        if gamma is None:
            gamma = 0.1 if isinstance(self._codec, TopK) else 1.0  # RandomK is a TopK
        self.gamma = check_fraction(gamma, "choco's gamma", "choco:ring,compress=topk:ratio=0.1,gamma=0.2")

    def setup(self, ctx: StepContext) -> None:
        who = "choco (a neighbour's public copy stays up to date only by hearing from it every step)"
        graph = self._graph = static_topology(self.topology, ctx.size, self.weights, who)
        self._sources = graph.in_neighbors(ctx.rank)
        self._dests = graph.out_neighbors(ctx.rank)
        self._restart_copies(ctx)

    def _restart_copies(self, ctx: StepContext) -> None:
        """All public copies at the current parameters: setup and a reset run where every rank holds the same."""
        start = ctx.model.params()
        self._copies = {peer: start.copy() for peer in (ctx.rank, *self._sources)}
        self._diff = np.zeros_like(start)
        size = len(self._diff)
        self._payloads = {peer: np.empty_like(self._encode(self._diff, 0)) for peer in self._sources}
        self._size = size
        self._requests: list[Request] = []
        self._out_of_step: set[int] = set()  # neighbours whose copy missed a refused update: left out for good

    def _encode(self, diff: np.ndarray, seed: int) -> np.ndarray:
        return diff.copy() if self._codec is None else self._codec.encode(diff, seed)  # none: float64 as it is

    def _decode(self, payload: np.ndarray, seed: int) -> np.ndarray:
        return payload if self._codec is None else self._codec.decode(payload, self._size, seed)

    def reset(self, ctx: StepContext) -> None:
        self._restart_copies(ctx)

    def after_step(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        check_own(ctx, params)
        rank, step = ctx.rank, ctx.step
        own = self._copies[rank]
        np.subtract(params, own, out=self._diff)
        payload = self._encode(self._diff, step * _SEED_STRIDE + rank)
        own += self._decode(payload, step * _SEED_STRIDE + rank)
        recvs = [self._payloads[peer] for peer in self._sources]
        self._requests = ctx.engine.exchange(payload, self._dests, recvs, self._sources, Tag.PARAMETERS)
        ctx.engine.wait_all(self._requests)
        self._requests = []
        for peer in self._sources:
            update = self._decode(self._payloads[peer], step * _SEED_STRIDE + peer)
            if peer in self._out_of_step or refused(ctx, peer, update, what="a compressed difference"):
                self._out_of_step.add(peer)
            else:
                self._copies[peer] += update
        # x_i += gamma sum_j w_ij (x^_j - x^_i) over the neighbours whose copies are in step
        for peer, weight in self._graph.in_weights(rank).items():
            if peer not in self._out_of_step:
                axpy(self.gamma * weight, self._copies[peer], params)
                axpy(-self.gamma * weight, own, params)
        ctx.model.set_params(params)

    def close(self, ctx: StepContext) -> None:
        ctx.engine.wait_all(self._requests)
        self._requests = []

    def abandon(self, ctx: StepContext) -> None:
        self._requests = []
