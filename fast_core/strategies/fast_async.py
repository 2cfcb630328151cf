"""Asynchronous FAST, as published: the trainer never blocks on the network.

A background thread (a Mailbox with a send gate) sends the newest gradient once one message from every neighbour
has arrived since the last send, and the trainer applies whatever arrived, each as one more optimizer step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fast_core.strategies.fast import FAST
from fast_core.strategies.integrity import check_own, refused
from fast_core.transport.mailbox import Mailbox

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext

_QUEUE_DEPTH = 4  # unread gradients kept per neighbour; the send gate keeps at most ~2 in flight


class AsyncFAST(FAST):
    """Post this step's gradient; apply every neighbour gradient that arrived since the last step."""

    lockstep = False
    synchronous = False

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self._open(ctx)

    def reset(self, ctx: StepContext) -> None:
        """Collective: gradients in flight were taken at parameters a checkpoint replaced; a new mailbox drops them."""
        self._mailbox.close()
        self._open(ctx)

    def _open(self, ctx: StepContext) -> None:
        self._mailbox = Mailbox(
            ctx.engine,
            self._sources,
            self._dests,
            ctx.layout.size,
            ctx.layout.dtype,
            codec=self._codec,
            feedback=True,
            gate=True,
            depth=_QUEUE_DEPTH,
            releases=True,  # each gradient is applied once, then its buffer goes back
            name="fast-gradients",
        )

    def before_step(self, ctx: StepContext) -> None:
        grads = ctx.model.grads()
        check_own(ctx, grads, "gradients", every=1)
        self._mailbox.post(grads, ctx.step)

    def after_step(self, ctx: StepContext) -> None:
        for peer in self._sources:
            for message in self._mailbox.take_all(peer):
                if not refused(ctx, peer, message.payload, "gradients"):  # a NaN/Inf gradient is not applied
                    ctx.model.apply_gradient(message.payload)
                    ctx.metrics.record_staleness(max(0, ctx.step - message.step))
            self._mailbox.release(peer)

    def close(self, ctx: StepContext) -> None:
        self._mailbox.close()

    def abandon(self, ctx: StepContext) -> None:
        self._mailbox.abandon()
