"""AD-PSGD (Lian et al. 2018): asynchronous pairwise averaging with one neighbour at a time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..mixing import axpy
from ..service import RequestService
from ..topology import Topology
from .async_avg import static_topology
from .base import Strategy

if TYPE_CHECKING:
    from ..worker import Worker


class ADPSGD(Strategy):
    """Each step a worker averages with one random neighbour: x_i, x_j <- (x_i + x_j) / 2, atomically per pair.

    The active worker sends its parameters a after step k and applies the reply at step k + 1, so the round trip
    overlaps with computing (gradients are taken on possibly stale parameters, as in the paper). The passive
    neighbour's communication thread answers with its latest parameters s, moves them to (a + s) / 2 and records
    the correction (a - s) / 2 that its trainer adds at its next step; the active one adds (s - a) / 2. Each pair's two
    corrections cancel, so the average of all workers is preserved exactly, and updates made in between are kept.
    The passive side never involves its trainer, so no wait cycle (deadlock) can form on any topology.
    """

    name = "adpsgd"

    def __init__(self, topology: str | Topology = "torus", seed: int = 0) -> None:
        self.topology = topology
        self.seed = seed

    def setup(self, worker: Worker) -> None:
        graph = static_topology(self.topology, worker.size, "uniform", "AD-PSGD")
        if not graph.is_undirected():
            raise ConfigError(f"AD-PSGD averages in pairs, so it needs an undirected topology; {graph!r} is directed")
        self._neighbors = graph.out_neighbors(worker.rank)
        self._rng = np.random.default_rng((self.seed, worker.rank))
        self._snapshot = np.array(worker.model.params(), copy=True)  # what this rank answers with
        self._correction = np.zeros_like(self._snapshot)
        self._service = RequestService(
            worker.engine,
            self._neighbors,
            worker.layout.size,
            worker.layout.dtype,
            self._answer,
            metrics=worker.metrics,
            name="adpsgd",
        )
        self._asked: np.ndarray | None = None

    def _answer(self, peer: int, theirs: np.ndarray, reply: np.ndarray) -> None:
        """Service thread: reply with our parameters and move them half-way towards theirs.

        The snapshot moves too, so several requests between two of our steps average in sequence, each with
        our value after the previous one, exactly as atomic pair averages would.
        """
        np.copyto(reply, self._snapshot)
        axpy(0.5, theirs, self._correction)
        axpy(-0.5, self._snapshot, self._correction)
        self._snapshot *= 0.5
        axpy(0.5, theirs, self._snapshot)

    def _settle(self, worker: Worker) -> np.ndarray:
        """Apply our pending pair average (waiting for its reply) and what peers' requests asked of us."""
        params = worker.model.params()
        service = self._service
        if service.pending is not None:
            start = time.perf_counter()
            theirs = service.reply(wait=True)  # usually here already: it travelled while we computed
            worker.metrics.wait_seconds += time.perf_counter() - start
            axpy(0.5, theirs, params)
            axpy(-0.5, self._asked, params)
        with service.lock:
            params += self._correction
            self._correction.fill(0.0)
            np.copyto(self._snapshot, params)
        worker.model.set_params(params)
        return params

    def after_step(self, worker: Worker) -> None:
        params = self._settle(worker)
        service = self._service
        if self._neighbors:
            peer = int(self._rng.choice(self._neighbors))
            service.ask(peer, params)
            self._asked = service.request_payload

    def close(self, worker: Worker) -> None:
        self._service.close()  # every rank's requests are answered once this returns
        self._settle(worker)  # so the last pairs' halves are applied and the average stays exact
