"""Asynchronous parameter server (Downpour SGD, Dean et al. 2012): no worker ever waits for another worker.

Each server rank's communication thread (a RequestService, as asynchronous EASGD's centre) answers a worker's
update of its shard by adding it to the shard and replying with the shard as it then is; the server's own trainer
does the same under the service's lock. Every message is the size of the largest shard (``array_split`` cuts
differ by at most one value), so one service per rank serves its shard and carries its own requests to the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..compression import open_service
from ..integrity import check_own, refused
from .ps import ParameterServer

if TYPE_CHECKING:
    from .base import StepContext


class AsyncPS(ParameterServer):
    """After its step a worker pushes d = x - x_pulled to every server (w_s <- w_s + scale d_s), pulls x_s <- w_s."""

    lockstep = False
    synchronous = False

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self._ctx = ctx  # the service thread counts refusals into its metrics
        self._pulled = np.array(ctx.model.params(), copy=True)
        self._delta = ctx.layout.empty()
        width = max(hi - lo for lo, hi in self._bounds)
        self._message = np.zeros(width, ctx.layout.dtype)
        self._shard: np.ndarray | None = None
        askers: list[int] = []
        if self._own is not None:
            lo, hi = self._bounds[self._own]
            self._shard = self._pulled[lo:hi].copy()
            askers = self._others
        handler = self._answer if self._own is not None else None
        self._service = open_service(ctx.engine, askers, width, ctx.layout.dtype, handler, self._codec, name="ps")

    def _answer(self, peer: int, update: np.ndarray, reply: np.ndarray) -> None:
        """Server thread: w <- w + scale update (not a NaN/Inf one: refused), then reply with w."""
        shard = self._shard
        if not refused(self._ctx, peer, update[: len(shard)], "updates"):
            shard += self._scale * update[: len(shard)]
        reply[: len(shard)] = shard
        reply[len(shard) :] = 0

    def after_step(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        check_own(ctx, params)
        np.subtract(params, self._pulled, out=self._delta)
        servers = len(self._bounds)
        for i in range(servers):  # each worker starts at its own shard, so the servers' load spreads
            server = (ctx.rank + i) % servers
            lo, hi = self._bounds[server]
            if server == self._own:
                with self._service.lock:
                    self._shard += self._scale * self._delta[lo:hi]
                    params[lo:hi] = self._shard
                continue
            self._message[: hi - lo] = self._delta[lo:hi]
            self._service.ask(server, self._message)
            shard = self._service.reply()[: hi - lo]
            if not refused(ctx, server, shard):  # a NaN/Inf server is not followed: the worker keeps its own
                params[lo:hi] = shard
        np.copyto(self._pulled, params)
        ctx.model.set_params(params)

    def reset(self, ctx: StepContext) -> None:
        """Collective: a checkpoint replaced the parameters; the servers start again from them."""
        self._service.close()
        self.setup(ctx)

    def close(self, ctx: StepContext) -> None:
        self._service.close()

    def abandon(self, ctx: StepContext) -> None:
        self._service.abandon()

    def server_shard(self) -> tuple[int, int, np.ndarray] | None:
        """(lo, hi, a copy of w) of the shard this rank serves, or None: the model Downpour delivers is the
        servers' shards put together."""
        if self._shard is None:
            return None
        lo, hi = self._bounds[self._own]
        with self._service.lock:
            return lo, hi, self._shard.copy()
