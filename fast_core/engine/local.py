"""N workers as threads of one process: the engine for tests, notebooks and simulation.

Messages are copied at send time (so senders may reuse their buffer at once) and matched in order per
(source, destination, tag), as MPI does. When one worker raises, the others stop with PeerFailed instead of
waiting for it until their timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..errors import MessageError, PeerFailed, PeerTimeout
from .base import Engine, Request, check_contiguous, check_kind, check_op, check_tag, resolve_timeout

_REDUCERS = {"sum": np.add, "min": np.minimum, "max": np.maximum}


class LocalCluster:
    """Shared mailboxes and collectives of ``size`` in-process workers."""

    def __init__(self, size: int, timeout: float | None = None) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one worker, got size={size}")
        self.size = size
        self.timeout = resolve_timeout(timeout)
        self._cond = threading.Condition()
        self._messages: dict[tuple[int, int, int], dict[int, np.ndarray]] = {}
        self._sent: dict[tuple[int, int, int], int] = {}
        self._tickets: dict[tuple[int, int, int], int] = {}
        self._collectives: dict[int, dict[int, Any]] = {}
        self._readers: dict[int, int] = {}
        self.failure: tuple[int, BaseException] | None = None
        self._parent: LocalCluster | None = None

    def link_failures(self, parent: LocalCluster) -> None:
        """Let a failure in ``parent`` (the cluster this one was dup'ed from) stop waits here too."""
        self._parent = parent

    def engine(self, rank: int) -> LocalEngine:
        return LocalEngine(self, rank)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(engine, *args, **kwargs)`` on every rank in its own thread; return results by rank.

        The first exception of any worker (the cause; the others then stop with PeerFailed) is re-raised here once
        all threads have stopped, with a note naming its rank.
        """
        results: list[Any] = [None] * self.size

        def body(rank: int) -> None:
            try:
                results[rank] = fn(self.engine(rank), *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - forwarded to the caller below
                self.fail(rank, exc)

        threads = [threading.Thread(target=body, args=(r,), name=f"fast-rank-{r}") for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.failure is not None:
            rank, exc = self.failure
            if hasattr(exc, "add_note") and not isinstance(exc, PeerFailed):  # Python 3.11+
                exc.add_note(f"(raised on rank {rank} of a LocalCluster of {self.size}; the other ranks stopped)")
            raise exc
        return results

    def fail(self, rank: int, exc: BaseException) -> None:
        with self._cond:
            if self.failure is None:
                self.failure = (rank, exc)
            self._cond.notify_all()

    def check_alive(self) -> None:
        if self._parent is not None:
            self._parent.check_alive()
        if self.failure is not None:
            rank, exc = self.failure
            raise PeerFailed(f"rank {rank} failed ({type(exc).__name__}: {exc}); stopping this worker too")

    # point to point -----------------------------------------------------------------------------------------
    def post(self, src: int, dst: int, tag: int, data: np.ndarray) -> None:
        key = (src, dst, tag)
        with self._cond:
            seq = self._sent.get(key, 0)
            self._sent[key] = seq + 1
            self._messages.setdefault(key, {})[seq] = data
            self._cond.notify_all()

    def ticket(self, src: int, dst: int, tag: int) -> int:
        key = (src, dst, tag)
        with self._cond:
            seq = self._tickets.get(key, 0)
            self._tickets[key] = seq + 1
            return seq

    def take(self, key: tuple[int, int, int], seq: int) -> np.ndarray | None:
        with self._cond:
            box = self._messages.get(key)
            return None if box is None else box.pop(seq, None)

    # collectives -------------------------------------------------------------------------------------------
    def deposit(self, rank: int, generation: int, value: Any) -> None:
        """Join collective number ``generation`` with ``value`` (nonblocking)."""
        with self._cond:
            self._collectives.setdefault(generation, {})[rank] = value
            self._cond.notify_all()

    def collect(self, generation: int) -> list[Any] | None:
        """Every rank's value of collective ``generation`` once all have joined, else None (nonblocking)."""
        with self._cond:
            slots = self._collectives.get(generation, {})
            if len(slots) < self.size:
                return None
            values = [slots[r] for r in range(self.size)]
            self._readers[generation] = self._readers.get(generation, 0) + 1
            if self._readers[generation] == self.size:
                del self._collectives[generation], self._readers[generation]
            return values

    def missing(self, generation: int) -> tuple[int, ...]:
        with self._cond:
            slots = self._collectives.get(generation, {})
            return tuple(r for r in range(self.size) if r not in slots)

    def gather_all(self, rank: int, generation: int, value: Any, what: str) -> list[Any]:
        """Deposit ``value`` for collective number ``generation`` and return every rank's value, in rank order."""
        deadline = time.monotonic() + self.timeout
        self.deposit(rank, generation, value)
        with self._cond:
            while (values := self.collect(generation)) is None:
                self.check_alive()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = self.missing(generation)
                    raise PeerTimeout(
                        f"rank {rank} waited {self.timeout:g} s in {what} #{generation} for rank(s) "
                        f"{list(missing)}, which never joined it (still computing, stuck, or on another code path)",
                        ranks=missing,
                    )
                self._cond.wait(min(left, 0.05))
            return values


class _LocalBarrier(Request):
    def __init__(self, cluster: LocalCluster, rank: int, generation: int) -> None:
        super().__init__("barrier", -1, -1, 0)
        self._cluster = cluster
        self._generation = generation
        cluster.deposit(rank, generation, None)

    def test(self) -> bool:
        self.done = self.done or self._cluster.collect(self._generation) is not None
        return self.done

    def describe(self) -> str:
        return f"barrier #{self._generation} (missing ranks {list(self._cluster.missing(self._generation))})"


class _LocalRecv(Request):
    def __init__(self, cluster: LocalCluster, buf: np.ndarray, source: int, rank: int, tag: int) -> None:
        super().__init__("receive", source, tag, buf.nbytes)
        self._cluster = cluster
        self._buf = buf
        self._key = (source, rank, tag)
        self._seq = cluster.ticket(source, rank, tag)

    def test(self) -> bool:
        if self.done:
            return True
        data = self._cluster.take(self._key, self._seq)
        if data is None:
            return False
        if data.nbytes != self._buf.nbytes or data.dtype != self._buf.dtype:
            raise MessageError(
                f"rank {self._key[1]} expected {self._buf.nbytes} bytes of {self._buf.dtype} from rank {self.peer} "
                f"(tag {self.tag}) but received {data.nbytes} bytes of {data.dtype}: the two ranks disagree on the "
                "message layout"
            )
        np.copyto(self._buf, data.reshape(self._buf.shape))
        self.done = True
        return True


class _Completed(Request):
    def __init__(self, kind: str, peer: int, tag: int, nbytes: int) -> None:
        super().__init__(kind, peer, tag, nbytes)
        self.done = True

    def test(self) -> bool:
        return True


class _KindKey(NamedTuple):
    """The key of a collective of one kind (COLLECTIVE_KINDS): numbered apart from the others, so collectives of
    different kinds never meet in the same slot (and never equal an unkinded collective's integer key)."""

    kind: str
    number: int

    def __str__(self) -> str:  # messages say "job allreduce(sum) #3"
        return str(self.number)


class LocalEngine(Engine):
    """One worker's view of a LocalCluster."""

    name = "local"
    threads_supported = True  # the cluster's queues are guarded by one lock

    def __init__(self, cluster: LocalCluster, rank: int) -> None:
        if not 0 <= rank < cluster.size:
            raise ValueError(f"rank {rank} does not exist in a cluster of {cluster.size}")
        self.cluster = cluster
        self.rank = rank
        self.size = cluster.size
        self.timeout = cluster.timeout
        self._generation = 0
        self._kind_counts: dict[str, int] = {}

    def check_alive(self) -> None:
        self.cluster.check_alive()

    def dup(self, timeout: float | None = None) -> LocalEngine:
        fresh = LocalCluster(self.size, self.timeout if timeout is None else timeout) if self.rank == 0 else None
        clusters = self._collective(fresh, "dup")
        clusters[0].link_failures(self.cluster)
        return clusters[0].engine(self.rank)

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Request:
        check_contiguous(buf, "isend")
        check_tag(tag)
        self.check_peer(dest)
        self.cluster.post(self.rank, dest, tag, buf.copy())
        return _Completed("send", dest, tag, buf.nbytes)

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Request:
        check_contiguous(buf, "irecv")
        check_tag(tag)
        self.check_peer(source)
        return _LocalRecv(self.cluster, buf, source, self.rank, tag)

    def _collective(self, value: Any, what: str) -> list[Any]:
        self._generation += 1
        return self.cluster.gather_all(self.rank, self._generation, value, what)

    def _kind_collective(self, value: Any, what: str, kind: str | None) -> list[Any]:
        """A collective of ``kind``: counted apart from the other kinds (see COLLECTIVE_KINDS)."""
        if kind is None:
            return self._collective(value, what)
        check_kind(kind)
        number = self._kind_counts[kind] = self._kind_counts.get(kind, 0) + 1
        return self.cluster.gather_all(self.rank, _KindKey(kind, number), value, f"{kind} {what}")  # type: ignore[arg-type]

    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        check_contiguous(buf, "allreduce")
        check_op(op)
        values = self._kind_collective(buf.copy(), f"allreduce({op})", kind)
        _REDUCERS[op].reduce(np.stack(values), axis=0, out=buf)

    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        check_contiguous(buf, "broadcast")
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast root {root} does not exist: ranks are 0..{self.size - 1}")
        values = self._kind_collective(buf.copy() if self.rank == root else None, "broadcast", kind)
        if self.rank != root:
            np.copyto(buf, values[root])

    def barrier(self) -> None:
        self._collective(None, "barrier")

    def ibarrier(self) -> Request:
        self._generation += 1
        return _LocalBarrier(self.cluster, self.rank, self._generation)
