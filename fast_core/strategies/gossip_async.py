"""Asynchronous gossip: one random peer per step, and the trainer never waits.

A background thread (a gossip box of fast_core.transport) moves the data while the trainer computes. The Mailbox
does not fit: it sends every post to all of its dests (O(N) traffic per step on the complete graph) and keeps a
model-sized receive posted from every source (O(N) memory). Instead a push is announced by a small notice and the
model-sized receive is posted only when a notice arrives; a pull asks with a small request that the peer's thread
answers with the newest parameters its trainer published. Memory stays a few model-sized buffers. With
``compress`` the boxes' slots carry the codec's bytes, and the averages use the decoded parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from fast_core.strategies.gossip import Gossip, average_into
from fast_core.strategies.integrity import check_own, refused
from fast_core.transport.gossip_boxes import PullBox, PushBox

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


class AsyncGossip(Gossip):
    """Pull: average with the newest answer of the last peer asked, then ask another; push: send to a random
    peer, average with whatever arrived. The variant's path is chosen once, at setup."""

    lockstep = False
    synchronous = False
    rank_options = ("seed",)  # each rank draws its own peers from (seed, rank) anyway

    def setup(self, ctx: StepContext) -> None:
        self._rng = np.random.default_rng((self.seed, ctx.rank))
        self._asked = -1  # the peer of the pull in flight
        params = ctx.model.params()
        if self.variant == "pull":
            pull_box = PullBox(ctx.engine, params, ctx.step, codec=self._codec)
            self._box: PullBox | PushBox = pull_box
            self._gossip: Callable[[StepContext], None] = partial(self._pull, pull_box)
        else:
            push_box = PushBox(ctx.engine, params, ctx.step, codec=self._codec)
            self._box = push_box
            self._gossip = partial(self._push, push_box)

    def after_step(self, ctx: StepContext) -> None:
        if ctx.size > 1:
            check_own(ctx, ctx.model.params())
            self._gossip(ctx)

    def close(self, ctx: StepContext) -> None:
        self._box.close()

    def reset(self, ctx: StepContext) -> None:
        """Collective: what is in flight lands and is dropped with the box (it came from the old parameters); a new
        box publishes the parameters now in place."""
        self._box.close()
        self.setup(ctx)

    def abandon(self, ctx: StepContext) -> None:
        self._box.abandon()

    def _draw_peer(self, ctx: StepContext) -> int | None:
        peer = int(self._rng.integers(0, ctx.size))
        return None if peer == ctx.rank else peer

    def _pull(self, box: PullBox, ctx: StepContext) -> None:
        params = ctx.model.params()
        reply = box.take()
        if reply is not None and not refused(ctx, self._asked, reply[0]):  # NaN/Inf: nothing changes
            payload, step = reply
            average_into(params, [payload])
            ctx.model.set_params(params)
            ctx.metrics.record_staleness(max(0, ctx.step - step))
        box.publish(params, ctx.step)
        if box.idle():  # at most one pull in flight: a new peer only once the last answer was used
            peer = self._draw_peer(ctx)
            if peer is not None:
                box.fetch(peer)
                self._asked = peer

    def _push(self, box: PushBox, ctx: StepContext) -> None:
        params = ctx.model.params()
        peer = self._draw_peer(ctx)
        if peer is not None:
            box.push(params, ctx.step, peer)  # skipped while the previous push has not left yet
        arrived = box.take_all()
        if arrived:
            kept = [(payload, step) for sender, payload, step in arrived if not refused(ctx, sender, payload)]
            average_into(params, [payload for payload, _ in kept], refusals=len(arrived) - len(kept))
            ctx.model.set_params(params)
            for _, step in kept:
                ctx.metrics.record_staleness(max(0, ctx.step - step))
