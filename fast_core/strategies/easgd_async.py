"""Asynchronous EASGD: each worker talks to the centre on its own schedule, and nobody waits for anybody else.

The centre rank's communication thread (a RequestService) answers a worker's x with the current z and applies
that worker's d = alpha (x - z) at once; the centre's own trainer moves z directly, under the service's lock.
With ``compress`` both messages travel as the codec's bytes (``RequestService(..., codec=)``): the centre
moves z by alpha (decoded x - z), the worker x by alpha (x - decoded z).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.model.mixing import axpy
from fast_core.strategies.easgd import ElasticRound, Talk
from fast_core.strategies.integrity import refused
from fast_core.transport.service import RequestService

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


class AsyncEASGD(ElasticRound):
    """d = alpha (x_i - z); x_i <- x_i - d; z <- z + d, one worker at a time, whenever that worker is due."""

    lockstep = False
    synchronous = False

    def _setup_centre(self, ctx: StepContext) -> Talk:
        self._ctx = ctx  # the service thread counts refusals into its metrics
        self._z_then = ctx.layout.empty()
        layout = ctx.layout
        self._service = RequestService(
            ctx.engine, self._others, layout.size, layout.dtype, self._answer, codec=self._codec, name="easgd"
        )
        return self._centre_talk

    def _setup_member(self, ctx: StepContext) -> Talk:
        self._service = RequestService(
            ctx.engine, [], ctx.layout.size, ctx.layout.dtype, None, codec=self._codec, name="easgd"
        )
        return self._member_talk

    def _answer(self, peer: int, theirs: np.ndarray, reply: np.ndarray) -> None:
        """Centre's thread: send back z, then z <- z + alpha (x_peer - z) (not for a NaN/Inf x_peer: refused)."""
        np.copyto(reply, self._z)
        if peer != self.center and refused(self._ctx, peer, theirs):
            return
        axpy(self._alpha, theirs, self._z)
        axpy(-self._alpha, reply, self._z)

    def _centre_talk(self, ctx: StepContext, params: np.ndarray) -> None:
        with self._service.lock:  # the centre's own worker talks to z directly
            self._answer(ctx.rank, params, self._z_then)
        self._pull(params, self._z_then)

    def _member_talk(self, ctx: StepContext, params: np.ndarray) -> None:
        self._service.ask(self.center, params)
        z = self._service.reply()
        if not refused(ctx, self.center, z):  # a NaN/Inf centre is not followed
            self._pull(params, z)

    def close(self, ctx: StepContext) -> None:
        self._service.close()

    def abandon(self, ctx: StepContext) -> None:
        self._service.abandon()
