"""Asynchronous nearest-neighbour parameter averaging (the torus idea on parameters, as BlueFog's windows do)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import parameter_codec
from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import static_topology
from fast_core.strategies.cost import CostProfile, neighbour_exchange
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.topology import Topology
from fast_core.transport.mailbox import Mailbox

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@registered
class AsyncAveraging(Strategy):
    """x_i <- w_ii x_i + sum_j w_ij x_j^(newest), never waiting unless a neighbour is > ``staleness`` steps behind.

    A background thread sends this worker's parameters after every step and keeps the newest parameters of each
    in-neighbour, whatever step they come from. Each message is mixed once: a neighbour with nothing new since
    the last step (or not heard from yet) lends its weight to the worker itself, so a stalled neighbour's old
    parameters do not keep pulling the model back (``remix_stale=True`` re-mixes the newest message at every
    step, the literal reading of the method; it trained 1-3 points worse on the CNN example, see the README).
    ``keep_progress=True`` (the default) mixes differences, x_i <- x_i + sum_j w_ij (x_j - x_i^sent), x_i^sent being
    the parameters this worker last sent: the optimizer's updates since then are kept whole rather than scaled by
    w_ii, as D-PSGD keeps its own update. It reached a target accuracy sooner and ended at or above the plain rule
    in 6 of 7 measured comparisons (issue 12; docs/bench_goals.md); ``keep_progress=False`` is the plain rule.
    ``staleness=None`` (or inf) never waits; ``staleness=s`` waits (with a timeout naming the neighbour)
    until every neighbour has reached at least step k - s.
    ``compress``: the codec the parameters travel in ("fp16", "bf16", "int8"; ``fast_core.compression``): the
    mailbox carries the codec's bytes and the neighbours mix the decoded values, each worker its own exact ones.
    """

    name = "async"
    lockstep = False

    def __init__(
        self,
        topology: str | Topology = "torus",
        staleness: float | None = None,
        weights: str = "uniform",
        remix_stale: bool = False,
        keep_progress: bool = True,
        compress: str | None = "none",
    ):
        if staleness is not None and not (staleness >= 0):
            raise ConfigError(f"staleness must be >= 0 steps (or None for no bound), got {staleness}")
        self.topology = topology
        self.staleness = None if staleness is None or math.isinf(staleness) else int(staleness)
        self.weights = weights
        self.remix_stale = bool(remix_stale)
        self.keep_progress = bool(keep_progress)
        self.compress = "none" if compress is None else str(compress)  # a strategy string's none: None
        self._codec = parameter_codec(compress, "async averaging")

    def cost_profile(self, size: int) -> CostProfile:
        """Its model to each out-neighbour from a communication thread: the step never waits for it."""
        return neighbour_exchange(self.topology, size, "background")

    def setup(self, ctx: StepContext) -> None:
        self._graph = static_topology(self.topology, ctx.size, self.weights, "async averaging")
        rank = ctx.rank
        self._self_weight = self._graph.self_weight(rank)
        self._in_weights = self._graph.in_weights(rank)
        self._mailbox = Mailbox(
            ctx.engine,
            self._graph.in_neighbors(rank),
            self._graph.out_neighbors(rank),
            ctx.layout.size,
            ctx.layout.dtype,
            codec=self._codec,
            releases=not self.remix_stale,  # a message is mixed once, then its buffer goes back: one copy less
            name="async-averaging",
        )
        self._mailbox.post(ctx.model.params(), ctx.step)
        # x_i^sent: without a codec the mailbox's newest message is exactly that (no copy kept here); a codec's bytes
        # are not the values, so then this worker keeps its own exact ones
        own_copy = self.keep_progress and self._codec is not None
        self._sent = np.array(ctx.model.params(), copy=True) if own_copy else None

    def reset(self, ctx: StepContext) -> None:
        """Collective: close the mailbox (every message in flight lands, unread ones are dropped, among them the
        old parameters posted at setup) and open a new one that posts the parameters now in place."""
        self._mailbox.close()
        self.setup(ctx)

    def after_step(self, ctx: StepContext) -> None:
        mailbox, step = self._mailbox, ctx.step
        if self.staleness is not None:
            for peer in self._in_weights:
                mailbox.wait_for(peer, min_step=step - self.staleness)
        params = ctx.model.params()
        check_own(ctx, params)
        heard = []
        for peer, weight in self._in_weights.items():
            message = mailbox.take(peer)
            if message is None or not (message.fresh or self.remix_stale):
                continue
            if not refused(ctx, peer, message.payload):  # NaN/Inf: not heard, its weight stays with this worker
                heard.append((weight, message.payload))
                ctx.metrics.record_staleness(max(0, step - message.step))
        if heard and self.keep_progress:  # x_i += sum_j w_ij (x_j - x_i^sent): own progress kept whole
            sent = self._sent if self._sent is not None else mailbox.last_posted()
            for weight, payload in heard:
                axpy(weight, payload, params)
                axpy(-weight, sent, params)
            ctx.model.set_params(params)
        elif heard:
            params *= self._self_weight + sum(self._in_weights.values()) - sum(w for w, _ in heard)
            for weight, payload in heard:
                axpy(weight, payload, params)
            ctx.model.set_params(params)
        if not self.remix_stale:
            for peer in self._in_weights:
                mailbox.release(peer)
        mailbox.post(params, step + 1)
        if self._sent is not None:
            np.copyto(self._sent, params)

    def close(self, ctx: StepContext) -> None:
        self._mailbox.close()

    def abandon(self, ctx: StepContext) -> None:
        self._mailbox.abandon()
