"""Elastic averaging SGD (Zhang et al. 2015): workers are pulled towards a centre variable held by one rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..mixing import axpy
from ..transport.service import RequestService
from .base import Strategy

if TYPE_CHECKING:
    from .base import StepContext


class EASGD(Strategy):
    """Every ``tau`` steps: d = alpha (x_i - z); x_i <- x_i - d; z <- z + d, with z kept on rank ``center``.

    Synchronous: all workers meet the centre at the same step (z moves by the sum of all d's, i.e. the
    reference's beta = N alpha). Asynchronous: each worker talks to the centre on its own schedule; the centre
    rank's communication thread answers with the current z and applies that worker's d at once, so no worker
    waits for another. ``alpha`` defaults to 0.9 / N, the reference code's beta = 0.9.
    """

    name = "easgd"

    def __init__(self, tau: int = 4, alpha: float | None = None, center: int = 0, synchronous: bool = True) -> None:
        if tau < 1:
            raise ConfigError(f"tau (steps between talks with the centre) must be >= 1, got {tau}")
        if alpha is not None and not 0 < alpha < 1:
            raise ConfigError(f"alpha (the elastic moving rate) must be in (0, 1), got {alpha}")
        self.tau = tau
        self.alpha = alpha
        self.center = center
        self.synchronous = synchronous

    @property
    def lockstep(self) -> bool:
        return self.synchronous

    def setup(self, ctx: StepContext) -> None:
        if not 0 <= self.center < ctx.size:
            raise ConfigError(f"center rank {self.center} does not exist: ranks are 0..{ctx.size - 1}")
        self._alpha = self.alpha if self.alpha is not None else 0.9 / ctx.size
        self._is_center = ctx.rank == self.center
        self._others = [r for r in range(ctx.size) if r != self.center]
        self._z = np.array(ctx.model.params(), copy=True) if self._is_center else None
        self._scratch = ctx.layout.empty()
        if self.synchronous:
            self._received = {r: ctx.layout.empty() for r in self._others} if self._is_center else {}
            self._z_in = None if self._is_center else ctx.layout.empty()
            return
        self._service = RequestService(
            ctx.engine,
            self._others if self._is_center else [],
            ctx.layout.size,
            ctx.layout.dtype,
            self._answer if self._is_center else None,
                        name="easgd",
        )

    def _answer(self, peer: int, theirs: np.ndarray, reply: np.ndarray) -> None:
        """Centre's thread: send back z, then z <- z + alpha (x_peer - z)."""
        np.copyto(reply, self._z)
        axpy(self._alpha, theirs, self._z)
        axpy(-self._alpha, reply, self._z)

    def after_step(self, ctx: StepContext) -> None:
        if ctx.size == 1 or (ctx.step + 1) % self.tau:
            return  # alone, the centre would only lag behind the worker: plain SGD, as every strategy on one rank
        if self.synchronous:
            self._synchronous_round(ctx)
        else:
            self._asynchronous_round(ctx)

    def _pull(self, params: np.ndarray, z: np.ndarray) -> None:
        """x <- x - alpha (x - z), in place."""
        params *= 1.0 - self._alpha
        axpy(self._alpha, z, params)

    def _synchronous_round(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        if self._is_center:
            np.copyto(self._scratch, self._z)  # z of this round, sent to every worker
            requests = ctx.engine.exchange(self._scratch, self._others, list(self._received.values()), self._others)
            ctx.engine.wait_all(requests)
            for x in (*self._received.values(), params):
                axpy(self._alpha, x, self._z)
            axpy(-self._alpha * ctx.size, self._scratch, self._z)
            self._pull(params, self._scratch)
        else:
            np.copyto(self._scratch, params)
            ctx.engine.wait_all(ctx.engine.exchange(self._scratch, [self.center], [self._z_in], [self.center]))
            self._pull(params, self._z_in)
        ctx.model.set_params(params)

    def _asynchronous_round(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        if self._is_center:
            with self._service.lock:  # the centre's own worker talks to z directly
                np.copyto(self._scratch, self._z)
                axpy(self._alpha, params, self._z)
                axpy(-self._alpha, self._scratch, self._z)
            self._pull(params, self._scratch)
        else:
            self._service.ask(self.center, params)
            z = self._service.reply()
            self._pull(params, z)
        ctx.model.set_params(params)

    def center_params(self) -> np.ndarray | None:
        """The centre variable z (on the centre rank; None elsewhere): the model EASGD delivers."""
        return self._z

    def close(self, ctx: StepContext) -> None:
        if not self.synchronous:
            self._service.close()
