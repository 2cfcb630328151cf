"""N workers as threads of one process: the engine for tests, notebooks and simulation.

Messages are copied at send time (so senders may reuse their buffer at once) and matched in order per
(source, destination, tag), as MPI does. When one worker raises, the others stop with PeerFailed instead of
waiting for it until their timeout.

``LocalCluster(size, fault_tolerant=True)`` survives a lost worker instead, as Open MPI with ULFM does: a worker
that raises in ``run()``, or that ``cluster.lose(rank)`` marks lost (the stand-in for kill -9), is lost; the
group (and its dups) is then revoked on every survivor until it calls ``shrink()``, which renumbers the survivors
over a new cluster (see membership.py). Revoked means: an operation started after the loss raises PeerLost at once
(send, receive, collective, dup, check_alive); one started before completes only if all it needs was delivered
before the loss (the message was sent, every member had joined the collective), else raises PeerLost when tested
or while it waits (woken at once). So a message a rank sent before it was lost is still received by a receive
posted before the loss, never by one posted after; what is left undelivered goes with the old group at the shrink.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fast_core.config.run import check_timeout
from fast_core.engine.base import (
    DEFAULT_TIMEOUT,
    Engine,
    Request,
    check_color,
    check_contiguous,
    check_kind,
    check_op,
    check_tag,
    deliver,
)
from fast_core.engine.capabilities import FaultTolerant
from fast_core.engine.membership import Membership, Shrink
from fast_core.errors import PeerFailed, PeerLost, PeerTimeout

_REDUCERS = {"sum": np.add, "min": np.minimum, "max": np.maximum}


class LocalCluster:
    """Shared mailboxes and collectives of ``size`` in-process workers (``fault_tolerant``: see the module)."""

    def __init__(
        self, size: int, timeout: float = DEFAULT_TIMEOUT, fault_tolerant: bool = False, max_ranks: int = 0
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one worker, got size={size}")
        self.size = size
        self.timeout = check_timeout(timeout)
        self._cond = threading.Condition()
        self._messages: dict[tuple[int, int, int], dict[int, np.ndarray]] = {}
        self._sent: dict[tuple[int, int, int], int] = {}
        self._tickets: dict[tuple[int, int, int], int] = {}
        self._collectives: dict[int, dict[int, Any]] = {}
        self._readers: dict[int, int] = {}
        self.failure: tuple[int, BaseException] | None = None
        self._parent: LocalCluster | None = None
        self.fault_tolerant = fault_tolerant
        self.members = tuple(range(size))
        """Each rank's launch number (``FaultTolerant.world_ranks``): itself, except in a cluster a shrink made."""
        self.membership = Membership(size, max_ranks) if fault_tolerant else None
        self.born = 0
        """The job's revocation count when this cluster was made: a later ``revoke`` of its members revokes it."""
        self._shrink: Shrink | None = None
        self._threads: dict[int, int] = {}  # rank -> thread ident under run(): where an awaited rank was, on a timeout
        if self.membership is not None:
            self.membership.watch(self._cond)

    def group(self, members: tuple[int, ...], timeout: float) -> LocalCluster:
        """A fault-tolerant cluster of this job over ``members`` (launch numbers), sharing its record of losses."""
        assert self.membership is not None, "only a fault-tolerant cluster makes groups"
        cluster = LocalCluster(len(members), timeout, fault_tolerant=True)
        cluster.members, cluster.membership, cluster.born = members, self.membership, self.membership.revocations
        self.membership.watch(cluster._cond)
        return cluster

    @property
    def lost(self) -> dict[int, BaseException]:
        """The lost ranks of the job (launch number -> the exception that ended it), in the order lost."""
        return {} if self.membership is None else self.membership.lost

    def lose(self, rank: int, exc: BaseException | None = None) -> None:
        """Mark ``rank`` (of this cluster) lost at once, as kill -9 would: its later engine calls raise, and with
        ``fault_tolerant`` the survivors' raise PeerLost; without, the job stops as after ``fail``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} does not exist in a cluster of {self.size}")
        launch = self.members[rank]
        if exc is None:
            exc = PeerLost(f"rank {launch} was lost (LocalCluster.lose, the stand-in for kill -9)", ranks=(launch,))
        if self.membership is None:
            self.fail(rank, exc)
        else:
            self.membership.lose(launch, exc)

    def link_failures(self, parent: LocalCluster) -> None:
        """Let a failure in ``parent`` (the cluster this one was dup'ed from) stop waits here too."""
        self._parent = parent

    def engine(self, rank: int) -> LocalEngine:
        """Rank ``rank``'s engine: a FaultTolerantLocalEngine in a fault-tolerant cluster, else a LocalEngine."""
        return (FaultTolerantLocalEngine if self.fault_tolerant else LocalEngine)(self, rank)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(engine, *args, **kwargs)`` on every rank in its own thread; return results by rank.

        The first exception of any worker (the cause; the others then stop with PeerFailed) is re-raised here once
        all threads have stopped, with a note naming its rank. With ``fault_tolerant``, a rank that raises is lost
        instead (``lost`` keeps its exception) and the survivors' results are returned, None for lost ranks; only
        when every rank is lost is the first loss's exception re-raised.
        """
        results: dict[int, Any] = {}
        threads: list[threading.Thread] = []

        def body(engine: LocalEngine, launch: int) -> None:
            self._threads[launch] = threading.get_ident()
            try:
                results[launch] = fn(engine, *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - forwarded to the caller below (fault tolerant: lost)
                if launch < self.size:
                    self.fail(launch, exc)
                else:  # a rank that joined later is no rank of this cluster: lost by its launch number
                    assert self.membership is not None
                    self.membership.lose(launch, exc)

        def start(engine: LocalEngine, launch: int) -> None:  # also called by a ``grow``, in a member's thread
            thread = threading.Thread(target=body, args=(engine, launch), name=f"fast-rank-{launch}")
            threads.append(thread)
            thread.start()

        if self.membership is not None:
            self.membership.start_newcomer = lambda engine: start(engine, engine.world_ranks[engine.rank])
        for rank in range(self.size):
            start(self.engine(rank), rank)
        joined = 0
        while joined < len(threads):  # a grow may add threads while the first ones run
            threads[joined].join()
            joined += 1
        if self.membership is not None:
            return self._survivors([results.get(n) for n in range(self.membership.launched)])
        if self.failure is not None:
            rank, exc = self.failure
            if hasattr(exc, "add_note") and not isinstance(exc, PeerFailed):  # Python 3.11+
                exc.add_note(f"(raised on rank {rank} of a LocalCluster of {self.size}; the other ranks stopped)")
            raise exc
        return [results.get(r) for r in range(self.size)]

    def _survivors(self, results: list[Any]) -> list[Any]:
        """Results by launch number (ranks that joined after the start last), None for lost ranks."""
        lost = self.lost
        if all(m in lost for m in range(len(results))):
            launch, exc = next(iter(lost.items()))
            if hasattr(exc, "add_note") and not isinstance(exc, PeerFailed):
                exc.add_note(f"(rank {launch} of a LocalCluster of {self.size}, lost first; then every rank was lost)")
            raise exc
        return [None if m in lost else value for m, value in enumerate(results)]

    def fail(self, rank: int, exc: BaseException) -> None:
        if isinstance(exc, PeerTimeout):
            self._note_where_awaited(exc)
        if self.membership is not None:  # fault tolerant: a failed rank is a lost one
            self.membership.lose(self.members[rank], exc)
            return
        with self._cond:
            if self.failure is None:
                self.failure = (rank, exc)
            self._cond.notify_all()

    def _note_where_awaited(self, exc: PeerTimeout) -> None:
        """Add to a timeout where each awaited rank's thread is now: in one process this tells a slow rank (in its
        own computation) from a stuck one (waiting on someone else), which the message alone cannot."""
        frames = sys._current_frames()
        for peer in exc.ranks:
            frame = frames.get(self._threads.get(peer, -1))
            if frame is not None and hasattr(exc, "add_note"):
                stack = "".join(traceback.format_stack(frame)[-6:])
                exc.add_note(f"rank {peer} was at (innermost last):\n{stack}")

    def check_alive(self, rank: int | None = None) -> None:
        """Raise when the job cannot go on as it is: PeerFailed after a failure; with ``fault_tolerant``, PeerLost
        when a member of this group is lost (PeerFailed when ``rank`` itself is)."""
        if self.membership is not None:
            self.membership.check(self.members, None if rank is None else self.members[rank], self.born)
            return
        if self._parent is not None:
            self._parent.check_alive()
        if self.failure is not None:
            rank, exc = self.failure
            raise PeerFailed(f"rank {rank} failed ({type(exc).__name__}: {exc}); stopping this worker too")

    def revoked(self, rank: int) -> None:
        """Fault tolerant: check_alive before each operation (a revoked group starts none). Else a no-op."""
        if self.membership is not None:
            self.check_alive(rank)

    def shrink(self, rank: int, timeout: float) -> tuple[tuple[int, ...], int, LocalCluster]:
        """Rank ``rank``'s part of the survivors' shrink (membership.Shrink): (launch numbers lost, its new rank,
        the survivors' cluster)."""
        if self.membership is None:
            raise PeerFailed("only LocalCluster(..., fault_tolerant=True) can shrink")
        with self._cond:
            if self._shrink is None:
                self._shrink = Shrink(self.members, self.membership)
        return self._shrink.join(self._cond, rank, timeout, lambda survivors: self.group(survivors, self.timeout))

    def named(self, ranks: tuple[int, ...]) -> str:
        """``rank(s) [..]``, with their launch numbers when a shrink renumbered them."""
        launch = [self.members[r] for r in ranks]
        return f"rank(s) {list(ranks)}" + ("" if launch == list(ranks) else f" (launch rank(s) {launch})")

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
        self.revoked(rank)
        self.deposit(rank, generation, value)
        with self._cond:
            while (values := self.collect(generation)) is None:
                self.check_alive(rank)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = self.missing(generation)
                    raise PeerTimeout(
                        f"rank {rank} waited {self.timeout:g} s in {what} #{generation} for {self.named(missing)}, "
                        "which never joined it (still computing, stuck, or on another code path)",
                        ranks=missing,
                    )
                self._cond.wait(min(left, 0.05))
            return values


class _LocalBarrier(Request):
    def __init__(self, cluster: LocalCluster, rank: int, generation: int) -> None:
        super().__init__("barrier", -1, -1, 0)
        self._cluster = cluster
        self._rank = rank
        self._generation = generation
        cluster.deposit(rank, generation, None)

    def test(self) -> bool:
        if not self.done:
            self.done = self._cluster.collect(self._generation) is not None
            if not self.done:
                self._cluster.revoked(self._rank)
        return self.done

    def awaited(self) -> tuple[int, ...]:
        return self._cluster.missing(self._generation)

    def describe(self) -> str:
        return f"barrier #{self._generation} (missing ranks {list(self.awaited())})"


class _LocalAllreduce(Request):
    """A nonblocking all-reduce: this rank's copy of the buffer joins collective ``key`` at once; the request
    completes, reducing every rank's copy into the buffer, once all have joined. As a barrier under revocation: a
    loss after every rank joined still completes it, one before raises PeerLost when tested."""

    def __init__(self, cluster: LocalCluster, rank: int, key: Any, buf: np.ndarray, op: str, what: str) -> None:
        super().__init__(what, -1, -1, buf.nbytes)
        self._cluster, self._rank, self._key, self._buf, self._op = cluster, rank, key, buf, op
        cluster.deposit(rank, key, buf.copy())

    def test(self) -> bool:
        if self.done:
            return True
        values = self._cluster.collect(self._key)
        if values is None:
            self._cluster.revoked(self._rank)
            return False
        _REDUCERS[self._op].reduce(np.stack(values), axis=0, out=self._buf)
        self.done = True
        return True

    def awaited(self) -> tuple[int, ...]:
        return self._cluster.missing(self._key)

    def describe(self) -> str:
        return f"{self.kind} #{self._key} (missing {self._cluster.named(self.awaited())})"


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
            self._cluster.revoked(self._key[1])
            return False
        deliver(self._key[1], self, data, self._buf)
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
        self.cluster.check_alive(self.rank)

    def dup(self, timeout: float | None = None) -> LocalEngine:
        seconds = self.timeout if timeout is None else timeout
        fresh = self._new_cluster(seconds) if self.rank == 0 else None
        clusters = self._collective(fresh, "dup")
        clusters[0].link_failures(self.cluster)
        return clusters[0].engine(self.rank)

    def _new_cluster(self, timeout: float) -> LocalCluster:
        """The cluster of a ``dup`` over the same ranks (made by rank 0 alone)."""
        return LocalCluster(self.size, timeout)

    def split(self, color: int) -> LocalEngine:
        """Two collectives: every rank's color, then each group's new cluster, made once by its first member. A
        failure in this cluster stops waits in the groups too."""
        check_color(color)
        colors = self._collective(int(color), "split (colors)")
        members = [r for r, c in enumerate(colors) if c == color]
        fresh = LocalCluster(len(members), self.timeout) if members[0] == self.rank else None
        cluster = self._collective(fresh, "split (groups)")[members[0]]
        cluster.link_failures(self.cluster)
        return cluster.engine(members.index(self.rank))

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Request:
        check_contiguous(buf, "isend")
        check_tag(tag)
        self.check_peer(dest)
        self.cluster.revoked(self.rank)
        self.cluster.post(self.rank, dest, tag, buf.copy())
        return _Completed("send", dest, tag, buf.nbytes)

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Request:
        check_contiguous(buf, "irecv")
        check_tag(tag)
        self.check_peer(source)
        self.cluster.revoked(self.rank)
        return _LocalRecv(self.cluster, buf, source, self.rank, tag)

    def _collective(self, value: Any, what: str) -> list[Any]:
        self._generation += 1
        return self.cluster.gather_all(self.rank, self._generation, value, what)

    def _kind_collective(self, value: Any, what: str, kind: str | None) -> list[Any]:
        """A collective of ``kind``: counted apart from the other kinds (see COLLECTIVE_KINDS)."""
        key, what = self._next_key(kind, what)
        return self.cluster.gather_all(self.rank, key, value, what)

    def _next_key(self, kind: str | None, what: str) -> tuple[Any, str]:
        """The key of this rank's next collective of ``kind`` and how messages name it."""
        if kind is None:
            self._generation += 1
            return self._generation, what
        check_kind(kind)
        number = self._kind_counts[kind] = self._kind_counts.get(kind, 0) + 1
        return _KindKey(kind, number), f"{kind} {what}"

    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        check_contiguous(buf, "allreduce")
        check_op(op)
        values = self._kind_collective(buf.copy(), f"allreduce({op})", kind)
        _REDUCERS[op].reduce(np.stack(values), axis=0, out=buf)

    def iallreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> Request:
        check_contiguous(buf, "iallreduce")
        check_op(op)
        self.cluster.revoked(self.rank)
        key, what = self._next_key(kind, f"allreduce({op})")
        return _LocalAllreduce(self.cluster, self.rank, key, buf, op, what)

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
        self.cluster.revoked(self.rank)
        self._generation += 1
        return _LocalBarrier(self.cluster, self.rank, self._generation)


class FaultTolerantLocalEngine(LocalEngine, FaultTolerant):
    """One worker's view of a ``LocalCluster(fault_tolerant=True)``: it survives a lost rank (see the module)."""

    @property
    def world_ranks(self) -> tuple[int, ...]:
        return self.cluster.members

    def shrink(self) -> tuple[int, ...]:
        """Collective among the survivors (see FaultTolerant.shrink and membership.Shrink): a member lost before the
        last survivor arrives is not waited for and is counted in this shrink's result (``()`` if none was lost);
        one lost after it leaves the new group revoked, so the next call raises PeerLost and the survivors shrink
        again. Engines dup'ed before stay revoked; dup again after."""
        lost, rank, cluster = self.cluster.shrink(self.rank, self.timeout)
        self.cluster, self.rank, self.size = cluster, rank, cluster.size
        self._generation = 0
        self._kind_counts = {}
        self.changes += 1
        return lost

    @property
    def max_ranks(self) -> int:  # type: ignore[override]
        assert self.cluster.membership is not None
        return self.cluster.membership.max_ranks

    def revoke(self, reason: str) -> None:
        assert self.cluster.membership is not None
        self.cluster.membership.revoke(self.cluster.members, f"rank {self.world_ranks[self.rank]}: {reason}")

    def grow(self, replacing: tuple[int, ...], adding: int = 0) -> tuple[int, ...]:
        """Collective over the group after ``shrink``: ``adding`` new workers, threads running the function the
        cluster runs (``LocalCluster.run``), take the next launch numbers and join (lost ranks are not replaced
        in-process: ``restarts_left`` is 0). Returns their launch numbers."""
        membership = self.cluster.membership
        assert membership is not None
        if not adding or membership.start_newcomer is None:
            return ()
        grown = None
        if self.rank == 0:  # one new cluster, made once
            numbers = tuple(range(membership.launched, membership.launched + adding))
            membership.launched += adding
            grown = (numbers, self.cluster.group(tuple(sorted(self.cluster.members + numbers)), self.timeout))
        numbers, cluster = self._collective(grown, "grow")[0]
        if self.rank == 0:
            for number in numbers:
                engine = cluster.engine(cluster.members.index(number))
                engine.joined = numbers
                membership.start_newcomer(engine)
        self.cluster, self.rank, self.size = cluster, cluster.members.index(self.world_ranks[self.rank]), cluster.size
        self._generation = 0
        self._kind_counts = {}
        self.changes += 1
        return numbers

    def _new_cluster(self, timeout: float) -> LocalCluster:
        """A dup's cluster shares the job's record of losses, so a loss revokes it too."""
        return self.cluster.group(self.cluster.members, timeout)

    def split(self, color: int) -> LocalEngine:
        raise NotImplementedError(
            f"rank {self.rank}: a fault-tolerant LocalCluster cannot split into groups yet (a lost rank would "
            "leave its group without a way to shrink); split a LocalCluster made without fault_tolerant"
        )
