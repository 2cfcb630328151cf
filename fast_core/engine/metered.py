"""An engine that counts what passes through it, so no strategy or communication thread counts by hand.

``MeteredEngine(engine, metrics)`` behaves exactly as ``engine`` and adds to ``metrics``: a send's bytes when it is
posted, a receive's bytes when it completes (a cancelled receive moved nothing), every second a wait or a
collective blocks the caller, and a ring all-reduce's traffic (about 2 (N-1)/N of the buffer in and out). Its
``dup()`` is metered into the same ``metrics``, so a strategy's communication thread is counted too. It has the
capabilities of ``engine`` (``fast_core.engine.capabilities``): a shrink or a virtual-time pump goes to ``engine``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

import numpy as np

from fast_core.engine.base import Engine, Request
from fast_core.engine.capabilities import FaultTolerant, Metered, VirtualTime
from fast_core.metrics import Metrics


class _Meter:
    """The counters of one worker, updated from the trainer and its communication threads under one lock."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()

    def sent(self, nbytes: int, messages: int = 1) -> None:
        with self._lock:
            self.metrics.bytes_sent += nbytes
            self.metrics.messages_sent += messages

    def received(self, nbytes: int, messages: int = 1) -> None:
        with self._lock:
            self.metrics.bytes_received += nbytes
            self.metrics.messages_received += messages

    def waited(self, seconds: float) -> None:
        with self._lock:
            self.metrics.wait_seconds += seconds


class MeteredRequest(Request):
    """A request of the wrapped engine; a receive is counted the first time it is seen complete."""

    def __init__(self, inner: Request, meter: _Meter) -> None:
        super().__init__(inner.kind, inner.peer, inner.tag, inner.nbytes)
        self.inner = inner
        self._meter = meter

    def test(self) -> bool:
        if not self.done and self.inner.test():
            self.finished()
        return self.done

    def finished(self) -> None:
        """Mark done once the inner request completed (also after a wait_all on the inner requests)."""
        if not self.done:
            self.done = True
            if self.kind == "receive":
                self._meter.received(self.nbytes)

    def cancel(self) -> None:
        self.inner.cancel()
        self.done = True

    def awaited(self) -> tuple[int, ...]:
        return self.inner.awaited()

    def describe(self) -> str:
        return self.inner.describe()


class MeteredEngine(Metered):
    """``engine`` with every message, byte and blocking second counted into ``metrics``. It has every capability
    ``engine`` has (``isinstance(MeteredEngine(engine, m), FaultTolerant)`` when ``engine`` is), forwarded to it."""

    def __new__(cls, engine: Engine, metrics: Metrics, meter: _Meter | None = None) -> MeteredEngine:
        if cls is MeteredEngine:  # the class that also forwards what ``engine`` can do besides messaging
            cls = _metered_class(tuple(c for c in _FORWARDERS if isinstance(engine, c)))
        return super().__new__(cls)

    def __init__(self, engine: Engine, metrics: Metrics, meter: _Meter | None = None) -> None:
        self.inner = engine
        self.metrics = metrics
        self._meter = meter if meter is not None else _Meter(metrics)
        self.name = engine.name

    @property
    def rank(self) -> int:  # type: ignore[override] - follows the inner engine through a shrink
        return self.inner.rank

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.inner.size

    @property
    def timeout(self) -> float:  # type: ignore[override]
        return self.inner.timeout

    @property
    def threads_supported(self) -> bool:  # type: ignore[override]
        return self.inner.threads_supported

    @property
    def thread_level(self) -> str:  # type: ignore[override]
        return self.inner.thread_level

    def record_wait(self, seconds: float) -> None:
        """Count ``seconds`` the trainer spent waiting on a peer outside the engine (a transport's own wait)."""
        self._meter.waited(seconds)

    # point to point ----------------------------------------------------------------------------------------------
    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Request:
        request = MeteredRequest(self.inner.isend(buf, dest, tag), self._meter)
        self._meter.sent(buf.nbytes)
        return request

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Request:
        return MeteredRequest(self.inner.irecv(buf, source, tag), self._meter)

    def wait_all(self, requests: Iterable[Request], timeout: float | None = None) -> None:
        pending = [r for r in requests if not r.done]
        if not pending:
            return
        start = time.perf_counter()
        try:
            self.inner.wait_all([r.inner if isinstance(r, MeteredRequest) else r for r in pending], timeout)
        finally:
            self._meter.waited(time.perf_counter() - start)
        for request in pending:
            if isinstance(request, MeteredRequest):
                request.finished()

    # collectives ---------------------------------------------------------------------------------------------------
    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        self._timed(self.inner.allreduce, buf, op, kind)
        self._count_allreduce(buf)

    def _count_allreduce(self, buf: np.ndarray) -> None:
        traffic = int(2 * buf.nbytes * (self.size - 1) / self.size)  # what a ring all-reduce moves each way
        self._meter.sent(traffic, messages=0)
        self._meter.received(traffic, messages=0)

    def iallreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> Request:
        """Its bytes are counted when posted, as allreduce's; the time the trainer blocks, when it is waited."""
        request = self.inner.iallreduce(buf, op, kind)
        self._count_allreduce(buf)
        return request

    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        self._timed(self.inner.broadcast, buf, root, kind)
        if self.size > 1:
            if self.rank == root:
                self._meter.sent(buf.nbytes, messages=0)
            else:
                self._meter.received(buf.nbytes, messages=0)

    def barrier(self) -> None:
        self._timed(self.inner.barrier)

    def ibarrier(self) -> Request:
        return self.inner.ibarrier()

    def dup(self, timeout: float | None = None) -> MeteredEngine:
        return MeteredEngine(self.inner.dup(timeout), self.metrics, self._meter)

    def split(self, color: int) -> MeteredEngine:
        """The inner engine's split, metered into the same ``metrics`` (a stage's averaging is training traffic)."""
        return MeteredEngine(self.inner.split(color), self.metrics, self._meter)

    def free(self) -> None:
        self.inner.free()

    def check_alive(self) -> None:
        self.inner.check_alive()

    def _timed(self, operation, *args) -> None:
        start = time.perf_counter()
        try:
            operation(*args)
        finally:
            self._meter.waited(time.perf_counter() - start)


class _ForwardsFaultTolerance(FaultTolerant):
    """A MeteredEngine's FaultTolerant part: the inner engine's (its shrink changes the rank and size read through)."""

    inner: FaultTolerant

    @property
    def world_ranks(self) -> tuple[int, ...]:
        return self.inner.world_ranks

    def shrink(self) -> tuple[int, ...]:
        return self.inner.shrink()

    def grow(self, replacing: tuple[int, ...], adding: int = 0) -> tuple[int, ...]:
        return self.inner.grow(replacing, adding)

    def leave(self, error: BaseException) -> NoReturn:
        self.inner.leave(error)

    def ask_to_grow(self, workers: int) -> None:
        self.inner.ask_to_grow(workers)

    def revoke(self, reason: str) -> None:
        self.inner.revoke(reason)

    def agreed_growth(self) -> int:
        return self.inner.agreed_growth()

    @property
    def max_ranks(self) -> int:  # type: ignore[override]
        return self.inner.max_ranks

    @property
    def restarts_left(self) -> int:  # type: ignore[override]
        return self.inner.restarts_left

    @property
    def joined(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.inner.joined

    @joined.setter
    def joined(self, value: tuple[int, ...]) -> None:
        self.inner.joined = value

    @property
    def changes(self) -> int:  # type: ignore[override]
        return self.inner.changes


class _ForwardsVirtualTime(VirtualTime):
    """A MeteredEngine's VirtualTime part: the inner engine's scheduling hooks."""

    inner: VirtualTime

    def attach_pump(self, pump: Callable[[], bool]) -> None:
        self.inner.attach_pump(pump)

    def nudge(self) -> None:
        self.inner.nudge()

    def idle(self) -> None:
        self.inner.idle()


_FORWARDERS: dict[type[Engine], type[Engine]] = {
    FaultTolerant: _ForwardsFaultTolerance,
    VirtualTime: _ForwardsVirtualTime,
}
"""Each capability a MeteredEngine takes from the engine it wraps, and the class that forwards it."""


@functools.cache
def _metered_class(capabilities: tuple[type[Engine], ...]) -> type[MeteredEngine]:
    """MeteredEngine with the forwarding of ``capabilities`` mixed in (one class per combination, made once)."""
    if not capabilities:
        return MeteredEngine
    name = "Metered" + "".join(c.__name__ for c in capabilities) + "Engine"
    return type(name, (MeteredEngine, *(_FORWARDERS[c] for c in capabilities)), {"__module__": __name__})


def unmetered(engine: Engine) -> Engine:
    """The engine under any metering: whole-job operations (start-up broadcast, evaluation averages) are not
    training traffic."""
    while isinstance(engine, MeteredEngine):
        engine = engine.inner
    return engine
