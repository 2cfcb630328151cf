"""Gradient tracking (DIGing: Nedic, Olshevsky and Shi 2017; here its adapt-then-combine form): decentralized SGD
for shards that are not identically distributed.

Under D-PSGD each worker descends its own shard's gradient, so with shards split by label the models are pulled
toward different optima and gossip only partly reconciles them. Gradient tracking gives each worker a tracker y_i of
the *average* gradient, mixed with the neighbours' every step and corrected by the change in its own gradient:

    y_i <- sum_j w_ij (y_j + g_j - g_j^prev)    (before the optimizer step; y starts at W g)
    x_i <- sum_j w_ij (x_j - lr y_j)            (the optimizer steps with y_i, then the parameters are mixed)

With a doubly stochastic W the mean of the trackers equals the mean of the current gradients at every step, so the
optimizer follows the global gradient whatever each shard holds. Two exchanges per step (the tracker and the
parameters), each of the parameters' size: twice D-PSGD's bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.strategies.base import Strategy
from fast_core.strategies.integrity import check_own
from fast_core.strategies.neighbours import NeighbourMix
from fast_core.strategies.registry import registered
from fast_core.topology import Topology, make_topology
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@registered
class GradientTracking(Strategy):
    """DIGing in adapt-then-combine form on ``topology`` (time-varying graphs too: both exchanges use the step's
    graph). The user's optimizer receives the tracker in place of the local gradient."""

    name = "tracking"
    uses_gradients = True

    def __init__(self, topology: str | Topology = "ring", weights: str = "uniform") -> None:
        self.topology = topology
        self.weights = weights

    def setup(self, ctx: StepContext) -> None:
        self._graph = make_topology(self.topology, ctx.size, weights=self.weights)
        self._mix = NeighbourMix(self._graph)
        self._restart(ctx)

    def _restart(self, ctx: StepContext) -> None:
        self._tracker = np.zeros_like(ctx.layout.empty())  # y_i (mixed), then y_i + g_i - g_i^prev before the mix
        self._previous = np.zeros_like(ctx.layout.empty())  # g_i^prev

    def reset(self, ctx: StepContext) -> None:
        self._restart(ctx)  # a loaded model's gradients start a new track (every rank resets together)

    def before_step(self, ctx: StepContext) -> None:
        grads = ctx.model.grads()
        check_own(ctx, grads, "gradients", every=1)
        self._tracker += grads  # y + g - g_prev
        self._tracker -= self._previous
        np.copyto(self._previous, grads)
        self._mix(ctx, self._tracker, ctx.step, "gradient trackers", Tag.GOSSIP)
        ctx.model.set_grads(self._tracker)

    def after_step(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        check_own(ctx, params)
        ctx.model.set_params(self._mix(ctx, params, ctx.step, "parameters", Tag.PARAMETERS))
