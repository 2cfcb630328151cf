"""The engine of ``fast simulate``: FAST's messaging protocol on virtual time, for hundreds of in-process workers.

It is the protocol every strategy is written against (``fast_core.engine.Engine``), so strategies run unchanged;
only time is virtual. A message sent at t is received at the time the link model gives (``LinkQueues``); a send
completes when its message has landed (as a rendezvous send does), so a thread that sends again only after its
last send completed is paced by its link. Collectives complete when the last rank joins plus their algorithm's time
(``LinkModel``). Waits never poll: a wait whose end is known sleeps until then, one whose end is not yet known
blocks until something addressed to its rank happens (``VirtualScheduler``).

Communication threads of asynchronous strategies do not run as threads here (``VirtualTime``): the scheduler
calls them (``attach_pump``) at the moment something lands for their rank, which is what a background thread that
is never short of a core would do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from fast_core.engine.base import Request, check_contiguous, check_kind, check_op, check_tag, deliver
from fast_core.engine.capabilities import VirtualTime
from fast_core.errors import PeerTimeout
from fast_core.simulate.links import LinkModel, LinkQueues
from fast_core.simulate.scheduler import Deadlock, VirtualScheduler

__all__ = ["SimCluster", "SimEngine"]

_REDUCERS = {"sum": np.add, "min": np.minimum, "max": np.maximum}
Finish = Callable[["_Collective", list[Any]], None]
"""How a rank turns every rank's value of a collective into its own result."""


class SimCluster:
    """``size`` simulated workers: one scheduler, one set of links, and the engines' shared mailboxes."""

    def __init__(self, size: int, links: LinkModel | None = None, timeout: float = float("inf")) -> None:
        if size < 1:
            raise ValueError(f"a simulated cluster needs at least one worker, got size={size}")
        self.size = size
        self.links = links or LinkModel()
        self.queues = LinkQueues(self.links, size)
        self.scheduler = VirtualScheduler(size)
        self.timeout = timeout

    def run(self, body: Callable[[SimEngine], Any]) -> list[Any]:
        """Run ``body(engine)`` on every rank on virtual time; returns the results in rank order, or re-raises the
        first rank's exception (by rank) with a note naming it."""
        self._root_context = _Context(self)
        results: list[Any] = [None] * self.size

        def trainer(rank: int) -> None:
            results[rank] = body(SimEngine(self, self._root_context, rank))

        self.scheduler.run(trainer)
        if self.scheduler.errors:
            rank, exc = min(self.scheduler.errors.items())
            if hasattr(exc, "add_note"):
                exc.add_note(f"(raised on rank {rank} of a simulated cluster of {self.size})")
            raise exc
        return results

    @property
    def now(self) -> float:
        return self.scheduler.now


class _Context:
    """One communicator: its messages and collectives never meet another's (``Engine.dup``)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.messages: dict[tuple[int, int, int], dict[int, tuple[float, np.ndarray]]] = {}
        self.sent: dict[tuple[int, int, int], int] = {}
        self.tickets: dict[tuple[int, int, int], int] = {}
        self.collectives: dict[Any, _Collective] = {}


class _Collective:
    """One collective of a context: each rank's value and the time it joined; complete once all have."""

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}
        self.joined: list[float] = []
        self.completes: float | None = None
        self.readers = 0
        self.result: np.ndarray | None = None  # an all-reduce's reduction, computed by the first rank to read it


class _SimRequest(Request):
    def ready_at(self) -> float | None:
        """The virtual time this request completes, once known."""
        raise NotImplementedError


class _SimSend(_SimRequest):
    def __init__(self, engine: SimEngine, dest: int, tag: int, nbytes: int, lands: float) -> None:
        super().__init__("send", dest, tag, nbytes)
        self._engine, self._lands = engine, lands

    def test(self) -> bool:
        self.done = self.done or self._engine.cluster.now >= self._lands
        return self.done

    def ready_at(self) -> float:
        return self._lands


class _SimRecv(_SimRequest):
    def __init__(self, engine: SimEngine, buf: np.ndarray, source: int, tag: int) -> None:
        super().__init__("receive", source, tag, buf.nbytes)
        self._engine, self._buf = engine, buf
        self._key = (source, engine.rank, tag)
        context = engine.context
        self._seq = context.tickets.get(self._key, 0)
        context.tickets[self._key] = self._seq + 1

    def _message(self) -> tuple[float, np.ndarray] | None:
        box = self._engine.context.messages.get(self._key)
        return None if box is None else box.get(self._seq)

    def ready_at(self) -> float | None:
        message = self._message()
        return None if message is None else message[0]

    def test(self) -> bool:
        if self.done:
            return True
        message = self._message()
        if message is None or message[0] > self._engine.cluster.now:
            return False
        deliver(self._engine.rank, self, self._engine.context.messages[self._key].pop(self._seq)[1], self._buf)
        return True


class _SimCollectiveRequest(_SimRequest):
    """This rank's part in one collective; ``finish`` turns every rank's value into this rank's result."""

    def __init__(self, engine: SimEngine, key: Any, what: str, finish: Finish) -> None:
        super().__init__(what, -1, -1, 0)
        self._engine, self._key, self._finish = engine, key, finish
        self.result: list[Any] | None = None

    def _slot(self) -> _Collective:
        return self._engine.context.collectives[self._key]

    def ready_at(self) -> float | None:
        return self._slot().completes

    def test(self) -> bool:
        if self.done:
            return True
        slot = self._slot()
        if slot.completes is None or slot.completes > self._engine.cluster.now:
            return False
        values = [slot.values[r] for r in range(self._engine.size)]
        slot.readers += 1
        if slot.readers == self._engine.size:
            del self._engine.context.collectives[self._key]
        self._finish(slot, values)
        self.result = values
        self.done = True
        return True

    def awaited(self) -> tuple[int, ...]:
        slot = self._slot()
        return tuple(r for r in range(self._engine.size) if r not in slot.values)

    def describe(self) -> str:
        return f"{self.kind} #{self._key} (missing ranks {list(self.awaited())})"


class SimEngine(VirtualTime):
    """One simulated worker's view of a SimCluster: the core protocol on virtual time (``VirtualTime``)."""

    name = "simulated"
    threads_supported = True

    def __init__(self, cluster: SimCluster, context: _Context, rank: int) -> None:
        if not 0 <= rank < cluster.size:
            raise ValueError(f"rank {rank} does not exist in a simulated cluster of {cluster.size}")
        self.cluster, self.context, self.rank, self.size = cluster, context, rank, cluster.size
        self.timeout = cluster.timeout
        self._generation = 0
        self._kind_counts: dict[str, int] = {}

    # virtual time --------------------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.cluster.now

    def compute(self, seconds: float) -> None:
        """Spend ``seconds`` of virtual time computing (a step's forward and backward pass)."""
        self.cluster.scheduler.sleep_until(self.rank, self.now + max(0.0, seconds))

    def attach_pump(self, pump: Callable[[], bool]) -> None:
        """Have the scheduler call ``pump`` whenever something lands for this rank (until it returns False)."""
        self.cluster.scheduler.pumps[self.rank].append(pump)
        self.nudge()

    def nudge(self) -> None:
        """Run this rank's pumps at the current time, once the running code gives the baton back."""
        self.cluster.scheduler.notify(self.rank, self.now)

    def idle(self) -> None:
        """Wait for the next thing addressed to this rank (a trainer waiting on its communication thread)."""
        self._block([])

    # point to point ------------------------------------------------------------------------------------------------
    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Request:
        check_contiguous(buf, "isend")
        check_tag(tag)
        self.check_peer(dest)
        _, lands = self.cluster.queues.send(self.now, self.rank, dest, buf.nbytes)
        key = (self.rank, dest, tag)
        seq = self.context.sent.get(key, 0)
        self.context.sent[key] = seq + 1
        self.context.messages.setdefault(key, {})[seq] = (lands, buf.copy())
        self.cluster.scheduler.notify(dest, lands)
        self.cluster.scheduler.notify(self.rank, lands)  # the send completes: the sender's thread may send again
        return _SimSend(self, dest, tag, buf.nbytes, lands)

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Request:
        check_contiguous(buf, "irecv")
        check_tag(tag)
        self.check_peer(source)
        return _SimRecv(self, buf, source, tag)

    def wait_all(self, requests: Iterable[Request], timeout: float | None = None) -> None:
        """Sleep until every request completes: to the time known for the last, or blocked until it is known."""
        pending = [r for r in requests if not r.done]
        limit = self.timeout if timeout is None else timeout
        start = self.now
        while pending:
            pending = [r for r in pending if not r.test()]
            if not pending:
                return
            if self.now - start > limit:
                raise self._timeout_error(pending, limit)
            times = [r.ready_at() if isinstance(r, _SimRequest) else None for r in pending]
            if self.cluster.scheduler.running != self.rank:
                raise RuntimeError(
                    f"rank {self.rank}: a communication thread waited inside the simulator for "
                    f"{pending[0].describe()}; on virtual time its work must only test requests"
                )
            if all(t is not None for t in times):
                self.cluster.scheduler.sleep_until(self.rank, max(times))  # type: ignore[type-var]
            else:
                self._block(pending)

    def _block(self, pending: list[Request]) -> None:
        try:
            self.cluster.scheduler.block(self.rank)
        except Deadlock:
            ranks = tuple(sorted({p for r in pending for p in r.awaited()}))
            what = "; ".join(r.describe() for r in pending[:4]) or "a message its communication thread awaits"
            raise PeerTimeout(
                f"rank {self.rank} waits at virtual time {self.now:.6g} s for rank(s) {list(ranks)} ({what}), "
                "but no simulated worker can send it any more: they all wait or have finished (a deadlock, or ranks "
                "running different numbers of steps)",
                ranks=ranks,
            ) from None

    def _timeout_error(self, pending: list[Request], limit: float) -> PeerTimeout:
        ranks = tuple(sorted({p for r in pending for p in r.awaited()}))
        return PeerTimeout(
            f"rank {self.rank} waited {limit:g} virtual seconds for rank(s) {list(ranks)}: {pending[0].describe()}",
            ranks=ranks,
        )

    # collectives ---------------------------------------------------------------------------------------------------
    def _next_key(self, kind: str | None) -> Any:
        if kind is None:
            self._generation += 1
            return self._generation
        check_kind(kind)
        number = self._kind_counts[kind] = self._kind_counts.get(kind, 0) + 1
        return (kind, number)

    def _join(self, key: Any, value: Any, seconds: float, what: str, finish: Finish):
        slot = self.context.collectives.setdefault(key, _Collective())
        if self.rank in slot.values:
            raise RuntimeError(f"rank {self.rank} joined {what} #{key} twice")
        slot.values[self.rank] = value
        slot.joined.append(self.now)
        if len(slot.values) == self.size:
            slot.completes = max(slot.joined) + seconds
            for rank in range(self.size):
                self.cluster.scheduler.notify(rank, slot.completes)
        return _SimCollectiveRequest(self, key, what, finish)

    def _collective(self, value: Any, seconds: float, what: str, kind: str | None = None) -> list[Any]:
        request = self._join(self._next_key(kind), value, seconds, what, lambda slot, values: None)
        self.wait_all([request])
        assert request.result is not None
        return request.result

    def iallreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> Request:
        check_contiguous(buf, "iallreduce")
        check_op(op)
        seconds = self.cluster.links.allreduce_seconds(buf.nbytes, self.size)

        key = self._next_key(kind)

        def finish(slot: _Collective, values: list[Any]) -> None:  # reduced once, not once per rank (256 ranks)
            if slot.result is None:
                slot.result = _REDUCERS[op].reduce(np.stack(values), axis=0)
            np.copyto(buf, slot.result)

        return self._join(key, buf.copy(), seconds, f"allreduce({op})", finish)

    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        self.wait_all([self.iallreduce(buf, op, kind)])

    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        check_contiguous(buf, "broadcast")
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast root {root} does not exist: ranks are 0..{self.size - 1}")
        seconds = self.cluster.links.broadcast_seconds(buf.nbytes, self.size)
        values = self._collective(buf.copy() if self.rank == root else None, seconds, "broadcast", kind)
        if self.rank != root:
            np.copyto(buf, values[root])

    def barrier(self) -> None:
        self._collective(None, self.cluster.links.barrier_seconds(self.size), "barrier")

    def ibarrier(self) -> Request:
        seconds = self.cluster.links.barrier_seconds(self.size)
        return self._join(self._next_key(None), None, seconds, "barrier", lambda slot, values: None)

    def dup(self, timeout: float | None = None) -> SimEngine:
        fresh = _Context(self.cluster) if self.rank == 0 else None
        context = self._collective(fresh, self.cluster.links.barrier_seconds(self.size), "dup")[0]
        engine = SimEngine(self.cluster, context, self.rank)
        engine.timeout = self.timeout if timeout is None else timeout
        return engine
