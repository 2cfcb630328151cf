"""Asynchronous parameter server (Downpour SGD, Dean et al. 2012): no worker ever waits for another worker.

Each server rank's communication thread (a RequestService, as asynchronous EASGD's centre) answers a worker's
update of its shard by adding it to the shard and replying with the shard as it then is; the server's own trainer
does the same under the service's lock. Every message is the size of the largest shard (``array_split`` cuts
differ by at most one value) plus one step count, so one service per rank serves its shard and carries its own
requests to the others.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np

from fast_core.engine.capabilities import count_wait
from fast_core.errors import ConfigError, PeerTimeout
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.ps import ParameterServer
from fast_core.transport.service import RequestService

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


class AsyncPS(ParameterServer):
    """After its step a worker pushes d = x - x_pulled to every server (w_s <- w_s + scale d_s), pulls x_s <- w_s.

    A message's last value is a step count: the worker's steps pushed (on a push) and the fewest any worker has
    pushed (on a reply), so that ``staleness`` can hold a worker back; every server hears every worker's pushes.
    """

    lockstep = False
    synchronous = False

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        if self.staleness is not None and np.dtype(ctx.layout.dtype).itemsize < 4:
            raise ConfigError(
                f"ps staleness needs float32 or float64 parameters to count steps in, not {ctx.layout.dtype}"
            )
        self._ctx = ctx  # the service thread counts refusals into its metrics
        self._first_step = ctx.step
        self._pulled = np.array(ctx.model.params(), copy=True)
        self._delta = ctx.layout.empty()
        width = max(hi - lo for lo, hi in self._bounds) + 1
        self._message = np.zeros(width, ctx.layout.dtype)
        self._shard: np.ndarray | None = None
        self._clocks = np.zeros(ctx.size)  # steps each worker pushed (kept by servers)
        askers: list[int] = []
        if self._own is not None:
            lo, hi = self._bounds[self._own]
            self._shard = self._pulled[lo:hi].copy()
            askers = self._others
        handler = self._answer if self._own is not None else None
        self._service = RequestService(
            ctx.engine, askers, width, ctx.layout.dtype, handler, codec=self._codec, name="ps"
        )

    def _answer(self, peer: int, update: np.ndarray, reply: np.ndarray) -> None:
        """Server thread: w <- w + scale update (not a NaN/Inf one: refused), then reply with w."""
        shard = self._shard
        n = len(shard)
        if not refused(self._ctx, peer, update[:n], "updates"):
            shard += self._scale * update[:n]
        reply[:n] = shard
        reply[n:] = 0
        if self.staleness is not None:
            self._clocks[peer] = max(self._clocks[peer], update[-1])
            reply[-1] = self._clocks.min()

    def after_step(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        check_own(ctx, params)
        np.subtract(params, self._pulled, out=self._delta)
        clock = ctx.step + 1 - self._first_step
        slowest = self._push_all(ctx, params, clock)
        if self.staleness is not None and slowest < clock - self.staleness:
            self._wait_for_slowest(ctx, params, clock)
        np.copyto(self._pulled, params)
        ctx.model.set_params(params)

    def _push_all(self, ctx: StepContext, params: np.ndarray, clock: float) -> float:
        """Push this step's update to every server and pull its shard into ``params``; the fewest steps any
        worker has pushed, as the servers last knew it."""
        slowest = 0.0
        servers = len(self._bounds)
        for i in range(servers):  # each worker starts at its own shard, so the servers' load spreads
            slowest = max(slowest, self._push(ctx, (ctx.rank + i) % servers, params, clock))
        return slowest

    def _push(self, ctx: StepContext, server: int, params: np.ndarray, clock: float) -> float:
        lo, hi = self._bounds[server]
        if server == self._own:
            with self._service.lock:
                self._shard += self._scale * self._delta[lo:hi]
                params[lo:hi] = self._shard
                self._clocks[ctx.rank] = max(self._clocks[ctx.rank], clock)
                return float(self._clocks.min())
        self._message[: hi - lo] = self._delta[lo:hi]
        self._message[hi - lo :] = 0
        if self.staleness is not None:
            self._message[-1] = clock
        self._service.ask(server, self._message)
        reply = self._service.reply()
        if not refused(ctx, server, reply[: hi - lo]):  # a NaN/Inf server is not followed: the worker keeps its own
            params[lo:hi] = reply[: hi - lo]
        return float(reply[-1])

    def _wait_for_slowest(self, ctx: StepContext, params: np.ndarray, clock: float) -> None:
        """Ask a server again, with no update, until every worker has pushed step clock - staleness (the pulls on
        the way keep ``params`` fresh); PeerTimeout after the engine's timeout."""
        self._delta[:] = 0
        server = self._own if self._own is not None else ctx.rank % len(self._bounds)
        start = time.monotonic()
        while self._push(ctx, server, params, clock) < clock - self.staleness:
            ctx.engine.check_alive()  # a server polls itself without messages: notice a lost rank here
            waited = time.monotonic() - start
            if waited > ctx.engine.timeout:
                raise PeerTimeout(
                    f"rank {ctx.rank} waited {waited:.0f} s at step {ctx.step} for the slowest worker to come within "
                    f"ps staleness={self.staleness} steps; a worker stopped pushing (dead, stuck, or closed early)"
                )
            time.sleep(1e-3)
        count_wait(ctx.engine, time.monotonic() - start)

    def reset(self, ctx: StepContext) -> None:
        """Collective: a checkpoint replaced the parameters; the servers start again from them."""
        self._service.close()
        self.setup(ctx)

    def close(self, ctx: StepContext) -> None:
        """Tell every server this worker pushes no more (its step count goes to inf: nobody waits for it), then
        close the service (collective)."""
        if self.staleness is not None:
            self._delta[:] = 0
            params = np.array(self._pulled, copy=True)
            for server in range(len(self._bounds)):
                self._push(ctx, server, params, math.inf)
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
