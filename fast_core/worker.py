"""A Worker ties one model (through the adapter contract) to a strategy and an engine.

Adapters call ``before_step`` between backward and the optimizer step and ``after_step`` after it; the strategy
decides what to exchange. The worker also owns the metrics and the start-up checks every job needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

import numpy as np

from .contract import ModelAdapter
from .engine import Engine, Request
from .flat import check_same_layout
from .metrics import Metrics
from .reporting import reporter_from_environment
from .straggler import straggler_from_environment
from .strategies import Strategy, make_strategy
from .strategies.spec import strategy_from_environment

log = logging.getLogger("fast")


class Worker:
    """One rank's training state: model adapter, strategy, engine, step counter and metrics."""

    def __init__(
        self,
        model: ModelAdapter,
        strategy: Strategy | str | None,
        engine: Engine,
        *,
        broadcast_start: bool = True,
        log_every: int | None = None,
    ) -> None:
        self.model = model
        self.engine = engine
        if strategy is None:  # the script names none: `fast run --strategy` (FAST_STRATEGY) or all-reduce
            self.strategy = strategy_from_environment()
        else:
            self.strategy = make_strategy(strategy) if isinstance(strategy, str) else strategy
        self.rank = engine.rank
        self.size = engine.size
        self.step = 0
        self.metrics = Metrics()
        self._broadcast_start = broadcast_start
        self.log_every = log_every
        self.uneven_inputs = False
        """Set while ranks may run out of data at different steps: lockstep strategies then count the ranks
        still training at every step, and a rank out of data calls join()."""
        self._started = False
        self._closed = False
        # under `fast run` (or with its environment variables): records, progress bar, a simulated straggler
        self._reporter = reporter_from_environment(self.rank)
        self._straggler = straggler_from_environment(self.rank, self.size)

    @property
    def layout(self):
        return self.model.layout

    def start(self) -> Worker:
        """Check every rank holds the same model, give all the same start, and let the strategy set up."""
        if self._started:
            return self
        check_same_layout(self.layout, self.engine)
        if self._broadcast_start:
            self.broadcast_params(root=0)
        self.strategy.setup(self)
        self._started = True
        if self._reporter is not None:
            self._reporter.start(self)
        if self._straggler is not None:
            self._straggler.restart()
        return self

    def before_step(self) -> None:
        """Hook between backward and the optimizer step (gradient strategies act here)."""
        self._ensure_started()
        if self._straggler is not None:
            self._straggler.slow_down()
        if self.uneven_inputs and self.strategy.lockstep:
            self.count_active(True)
        self.strategy.before_step(self)

    def after_step(self) -> None:
        """Hook after the optimizer step (parameter strategies act here)."""
        self._ensure_started()
        self.strategy.after_step(self)
        self.step += 1
        self.metrics.steps = self.step
        if self.log_every and self.step % self.log_every == 0:
            self.log_metrics()
        if self._reporter is not None:
            self._reporter.after_step(self)
        if self._straggler is not None:
            self._straggler.restart()

    def log_metrics(self) -> dict[str, float | int | None]:
        """Log this rank's metrics on the ``fast`` logger (INFO) and return them as a dict."""
        data = self.metrics.as_dict()
        log.info("rank %d %s", self.rank, " ".join(f"{k}={_short(v)}" for k, v in data.items()))
        return data

    def count_active(self, active: bool) -> int:
        """Collective: how many ranks still have data at this step (the join protocol's one small allreduce)."""
        flag = np.array([1 if active else 0], dtype=np.int64)
        self.engine.allreduce(flag)
        return int(flag[0])

    def join(self) -> int:
        """Called by a rank out of data: take part in the steps of the others, with a zero gradient, until every
        rank is out of data, so lockstep strategies never hang on uneven inputs. Returns the steps shadowed.

        Requires ``uneven_inputs = True`` on every rank while training (adapters' join helpers set it).
        """
        if not self.strategy.lockstep:
            return 0
        if not self.uneven_inputs:
            raise RuntimeError("join() needs uneven_inputs=True on every rank during training (use the adapter's join)")
        shadowed = 0
        while self.count_active(False):
            grads = self.model.grads()
            grads.fill(0.0)
            self.model.set_grads(grads)
            self.strategy.before_step(self)
            self.model.apply_gradient(self.model.grads())  # all-reduce ranks stay identical: same mean gradient
            self.after_step()
            shadowed += 1
        return shadowed

    def end_epoch(self, metric: float) -> None:
        """Tell the strategy an epoch ended, with this rank's validation metric (higher is better)."""
        self._ensure_started()
        self.strategy.end_epoch(self, metric)
        if self._straggler is not None:
            self._straggler.restart()  # the epoch's evaluation is not compute to stretch

    @property
    def reporting(self) -> bool:
        """True under `fast run` (a run folder, progress bar or verbose lines asked for): what ``record`` is for.
        Scripts check it before computing a per-step number only the records need."""
        return self._reporter is not None

    def record(self, **values: float) -> None:
        """This step's numbers for the run log and progress bar under `fast run`, e.g. ``record(loss=0.3,
        samples=32)``: averaged between records (``samples`` adds up). Free when not under `fast run`."""
        if self._reporter is not None:
            self._reporter.values(values)

    def record_epoch(self, **values: float) -> None:
        """One "epoch" record now, e.g. ``record_epoch(val_accuracy=0.93, loss=0.2)``, with the metrics and the
        last consensus distance computed (epochs are counted unless ``epoch=`` is given)."""
        if self._reporter is not None:
            self._reporter.epoch(self, values)
        if self._straggler is not None:
            self._straggler.restart()

    def record_result(self, **values: float) -> None:
        """Final numbers of the run, e.g. ``record_result(test_accuracy=0.95)``, also after ``close()``."""
        if self._reporter is not None:
            self._reporter.result(self, values)

    def close(self) -> None:
        """Finish pending communication; call once at the end of training on every rank."""
        if self._started and not self._closed:
            self.strategy.close(self)
            self._closed = True
            if self._reporter is not None:
                self._reporter.close(self)
            log.debug("rank %d closed after %d steps", self.rank, self.step)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()
        if self._closed:
            raise RuntimeError("this FAST worker was closed; create a new one to train again")

    # messaging helpers that keep the metrics ---------------------------------------------------------------
    def exchange(
        self, send: np.ndarray, dests: Sequence[int], recvs: Sequence[np.ndarray], sources: Sequence[int], tag: int = 0
    ) -> list[Request]:
        """Nonblocking: send ``send`` to every dest and receive one buffer from every source."""
        requests = self.engine.exchange(send, dests, recvs, sources, tag)
        self.metrics.bytes_sent += send.nbytes * len(dests)
        self.metrics.messages_sent += len(dests)
        self.metrics.bytes_received += sum(r.nbytes for r in recvs)
        self.metrics.messages_received += len(recvs)
        return requests

    def wait_all(self, requests: Iterable[Request]) -> None:
        start = time.perf_counter()
        self.engine.wait_all(requests)
        self.metrics.wait_seconds += time.perf_counter() - start

    def allreduce(self, buf: np.ndarray, op: str = "sum") -> None:
        start = time.perf_counter()
        self.engine.allreduce(buf, op)
        self.metrics.wait_seconds += time.perf_counter() - start
        # ring all-reduce moves about 2 (N-1)/N of the buffer in and out of each rank
        traffic = int(2 * buf.nbytes * (self.size - 1) / self.size)
        self.metrics.bytes_sent += traffic
        self.metrics.bytes_received += traffic

    # whole-job operations -------------------------------------------------------------------------------------
    def broadcast_params(self, root: int = 0) -> None:
        """Overwrite every rank's parameters with ``root``'s."""
        params = np.ascontiguousarray(self.model.params())
        self.engine.broadcast(params, root)
        self.model.set_params(params)

    def restart_from_best(self, metric: float, reset_optimizer: bool = False) -> int:
        """Give every rank the parameters of the rank with the highest ``metric`` (lowest rank on ties).

        Collective. With ``reset_optimizer`` the adapter's ``reset_optimizer()`` also clears optimizer state,
        as the original FAST did. Returns the rank whose parameters were taken.
        """
        best = np.array([metric], dtype=np.float64)
        self.engine.allreduce(best, op="max")
        owner = np.array([self.rank if metric >= best[0] else self.size], dtype=np.int64)
        self.engine.allreduce(owner, op="min")
        self.broadcast_params(root=int(owner[0]))
        if reset_optimizer:
            reset = getattr(self.model, "reset_optimizer", None)
            if reset is None:
                raise TypeError(f"{type(self.model).__name__} has no reset_optimizer(); the adapter cannot reset state")
            reset()
        return int(owner[0])

    def average_params(self) -> np.ndarray:
        """The mean of all ranks' parameters (one allreduce); every rank must call it."""
        mean = np.array(self.model.params(), copy=True)
        self.engine.allreduce(mean)
        mean /= self.size
        return mean

    def consensus_distance(self) -> float:
        """(1/N) sum_i ||x_i - x_bar||^2, the spread decentralized methods keep small; every rank must call it."""
        mean = self.average_params()
        spread = np.array([np.sum((self.model.params() - mean) ** 2, dtype=np.float64)])
        self.engine.allreduce(spread)
        value = float(spread[0]) / self.size
        self.metrics.consensus_distance = value
        return value


def _short(value: float | int | None) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
