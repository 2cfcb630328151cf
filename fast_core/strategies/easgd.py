"""Elastic averaging SGD (Zhang et al. 2015): workers are pulled towards a centre variable held by one rank."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..mixing import axpy
from ..service import RequestService
from .base import Strategy

if TYPE_CHECKING:
    from ..worker import Worker


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

    def setup(self, worker: Worker) -> None:
        if not 0 <= self.center < worker.size:
            raise ConfigError(f"center rank {self.center} does not exist: ranks are 0..{worker.size - 1}")
        self._alpha = self.alpha if self.alpha is not None else 0.9 / worker.size
        self._is_center = worker.rank == self.center
        self._others = [r for r in range(worker.size) if r != self.center]
        self._z = np.array(worker.model.params(), copy=True) if self._is_center else None
        self._scratch = worker.layout.empty()
        if self.synchronous:
            self._received = {r: worker.layout.empty() for r in self._others} if self._is_center else {}
            self._z_in = None if self._is_center else worker.layout.empty()
            return
        self._service = RequestService(
            worker.engine,
            self._others if self._is_center else [],
            worker.layout.size,
            worker.layout.dtype,
            self._answer if self._is_center else None,
            metrics=worker.metrics,
            name="easgd",
        )

    def _answer(self, peer: int, theirs: np.ndarray, reply: np.ndarray) -> None:
        """Centre's thread: send back z, then z <- z + alpha (x_peer - z)."""
        np.copyto(reply, self._z)
        axpy(self._alpha, theirs, self._z)
        axpy(-self._alpha, reply, self._z)

    def after_step(self, worker: Worker) -> None:
        if worker.size == 1 or (worker.step + 1) % self.tau:
            return  # alone, the centre would only lag behind the worker: plain SGD, as every strategy on one rank
        if self.synchronous:
            self._synchronous_round(worker)
        else:
            self._asynchronous_round(worker)

    def _pull(self, params: np.ndarray, z: np.ndarray) -> None:
        """x <- x - alpha (x - z), in place."""
        params *= 1.0 - self._alpha
        axpy(self._alpha, z, params)

    def _synchronous_round(self, worker: Worker) -> None:
        params = worker.model.params()
        if self._is_center:
            np.copyto(self._scratch, self._z)  # z of this round, sent to every worker
            requests = worker.exchange(self._scratch, self._others, list(self._received.values()), self._others)
            worker.wait_all(requests)
            for x in (*self._received.values(), params):
                axpy(self._alpha, x, self._z)
            axpy(-self._alpha * worker.size, self._scratch, self._z)
            self._pull(params, self._scratch)
        else:
            np.copyto(self._scratch, params)
            worker.wait_all(worker.exchange(self._scratch, [self.center], [self._z_in], [self.center]))
            self._pull(params, self._z_in)
        worker.model.set_params(params)

    def _asynchronous_round(self, worker: Worker) -> None:
        params = worker.model.params()
        if self._is_center:
            with self._service.lock:  # the centre's own worker talks to z directly
                np.copyto(self._scratch, self._z)
                axpy(self._alpha, params, self._z)
                axpy(-self._alpha, self._scratch, self._z)
            self._pull(params, self._scratch)
        else:
            start = time.perf_counter()
            self._service.ask(self.center, params)
            z = self._service.reply(wait=True)
            worker.metrics.wait_seconds += time.perf_counter() - start
            self._pull(params, z)
        worker.model.set_params(params)

    def center_params(self) -> np.ndarray | None:
        """The centre variable z (on the centre rank; None elsewhere): the model EASGD delivers."""
        return self._z

    def close(self, worker: Worker) -> None:
        if not self.synchronous:
            self._service.close()
