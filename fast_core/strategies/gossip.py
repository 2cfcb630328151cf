"""Gossiping SGD (Jin et al. 2016): after its local step a worker averages with one uniformly random rank.

pull: worker i picks j among all N ranks (itself included: then nothing changes) and sets x_i <- (x_i + x_j) / 2.
push: worker i sends x_i to a random j (itself: nothing is sent); each worker then takes the count-normalised
      average of its own x_i and every x that arrived: x_i <- (x_i + sum received) / (1 + number received).
Both keep the mean of the workers in expectation only (a worker's value may be counted more than once).

Synchronous (the default): every rank draws the whole step's choice vector from one generator seeded by
(seed, step), so each knows whom it sends to and whom it hears from, and x_j is j's value after j's own step.

Asynchronous (``synchronous=False``): one random peer per step, and the trainer never waits. A background
thread (a CommThread, as the Mailbox uses) moves the data while the trainer computes. The Mailbox itself does
not fit: it sends every post to all of its dests (O(N) traffic per step on the complete graph) and keeps a
model-sized receive posted from every source (O(N) memory). Instead a push is announced by an 8-byte notice and
the model-sized receive is posted only when a notice arrives; a pull asks with an 8-byte request that the
peer's thread answers with the newest parameters its trainer published. Memory stays a few model-sized buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..mixing import axpy
from ..transport.gossip_boxes import PullBox, PushBox
from ..transport.tags import Tag
from .base import Strategy

if TYPE_CHECKING:
    from .base import StepContext

VARIANTS = ("pull", "push")



def peer_choices(seed: int, step: int, size: int) -> np.ndarray:
    """c[i] is the rank worker i gossips with at ``step``: uniform over all ``size`` ranks, itself included.

    Every rank computes the same vector, which is what lets the synchronous variants post exactly the right
    sends and receives without asking anyone.
    """
    return np.random.default_rng((seed, step)).integers(0, size, size=size)


def _average_into(params: np.ndarray, others: list[np.ndarray]) -> None:
    """params <- (params + sum(others)) / (1 + len(others)), in place."""
    for x in others:
        axpy(1.0, x, params)
    params *= 1.0 / (1 + len(others))


class Gossip(Strategy):
    """Pull- or push-gossip with one uniformly random rank per step, synchronous (seeded) or asynchronous."""

    name = "gossip"
    bare_option = "variant"  # "gossip:push" in a strategy string

    def __init__(self, variant: str = "pull", synchronous: bool = True, seed: int = 0) -> None:
        if variant not in VARIANTS:
            raise ConfigError(f"gossip variant must be 'pull' or 'push', got {variant!r}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"gossip seed must be an integer >= 0 (all ranks must give the same), got {seed!r}")
        self.variant = variant
        self.synchronous = bool(synchronous)
        self.seed = int(seed)

    @property
    def lockstep(self) -> bool:
        return self.synchronous

    def setup(self, ctx: StepContext) -> None:
        if self.synchronous:
            self._send = ctx.layout.empty()
            self._pool: list[np.ndarray] = []  # receive buffers, grown to the most arrivals seen in one step
            return
        self._rng = np.random.default_rng((self.seed, ctx.rank))
        params = ctx.model.params()
        box = PullBox if self.variant == "pull" else PushBox
        self._box = box(ctx.engine, params, ctx.step)

    def after_step(self, ctx: StepContext) -> None:
        if ctx.size == 1:
            return
        if self.synchronous:
            self._sync_step(ctx)
        elif self.variant == "pull":
            self._pull_async(ctx)
        else:
            self._push_async(ctx)

    def close(self, ctx: StepContext) -> None:
        if not self.synchronous:
            self._box.close()

    # synchronous ------------------------------------------------------------------------------------------------
    def _receive_buffers(self, ctx: StepContext, count: int) -> list[np.ndarray]:
        while len(self._pool) < count:
            self._pool.append(ctx.layout.empty())
        return self._pool[:count]

    def _sync_step(self, ctx: StepContext) -> None:
        rank = ctx.rank
        choice = peer_choices(self.seed, ctx.step, ctx.size)
        target = int(choice[rank])
        chosen_by = [int(k) for k in np.flatnonzero(choice == rank) if k != rank]
        partner = [target] if target != rank else []
        sources, dests = (partner, chosen_by) if self.variant == "pull" else (chosen_by, partner)
        if not sources and not dests:
            return
        params = ctx.model.params()
        if dests:
            np.copyto(self._send, params)
        recvs = self._receive_buffers(ctx, len(sources))
        ctx.engine.wait_all(ctx.engine.exchange(self._send, dests, recvs, sources, Tag.GOSSIP))
        if recvs:
            _average_into(params, recvs)
            ctx.model.set_params(params)

    # asynchronous -----------------------------------------------------------------------------------------------
    def _draw_peer(self, ctx: StepContext) -> int | None:
        peer = int(self._rng.integers(0, ctx.size))
        return None if peer == ctx.rank else peer

    def _pull_async(self, ctx: StepContext) -> None:
        box: PullBox = self._box
        params = ctx.model.params()
        reply = box.take()
        if reply is not None:
            payload, step = reply
            _average_into(params, [payload])
            ctx.model.set_params(params)
            ctx.metrics.record_staleness(max(0, ctx.step - step))
        box.publish(params, ctx.step)
        if box.idle():  # at most one pull in flight: a new peer only once the last answer was used
            peer = self._draw_peer(ctx)
            if peer is not None:
                box.fetch(peer)

    def _push_async(self, ctx: StepContext) -> None:
        box: PushBox = self._box
        params = ctx.model.params()
        peer = self._draw_peer(ctx)
        if peer is not None:
            box.push(params, ctx.step, peer)  # skipped while the previous push has not left yet
        arrived = box.take_all()
        if arrived:
            _average_into(params, [payload for payload, _ in arrived])
            ctx.model.set_params(params)
            for _, step in arrived:
                ctx.metrics.record_staleness(max(0, ctx.step - step))
