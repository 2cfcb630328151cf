"""The small messaging protocol every strategy is written against, and the timed wait they all share.

An engine moves raw NumPy buffers between ranks: nonblocking point-to-point sends and receives, plus allreduce,
broadcast and barrier. Nothing is pickled. Every wait has a deadline, and a missed deadline names the peer.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

import numpy as np

from fast_core.config.run import DEFAULT_TIMEOUT
from fast_core.errors import MessageError, PeerTimeout

__all__ = ["COLLECTIVE_KINDS", "DEFAULT_TIMEOUT", "Engine", "Patience", "Request"]


REDUCE_OPS = ("sum", "min", "max")
SPIN_POLLS = 20
"""Polls a wait makes back to back before it starts yielding the core."""
YIELD_SECONDS = 0.02
"""How long a wait yields the core between polls (os.sched_yield) before it starts to sleep."""
MAX_USER_TAG = 30000
"""Tags at or above this are reserved for the engines' own bookkeeping."""
COLLECTIVE_KINDS = ("gradients", "parameters", "job")
"""Kinds of collective that can never match one another: ``allreduce(buf, kind=...)`` and ``broadcast(...,
kind=...)``. "gradients": a strategy averaging gradients in training; "parameters": a strategy averaging
parameters in training (local SGD); "job": whole-job operations of ``fast_core.engine.collectives`` (the consensus
model, start-up broadcast, epoch-end restarts, averaged logs). A collective without a kind (control numbers, checks)
matches only collectives without one.

Why: collectives of a communicator match by their order alone, so a rank averaging the consensus model
(``average_params``) and a rank in the gradient all-reduce of a model of the same size used to add up each other's
buffers silently. Each kind therefore runs on its own duplicate of the communicator (MPI: ``Comm.Idup``, all kinds at
once, in this fixed order, at the first collective that names a kind; in-process: a counter per kind). Two
different kinds never match: each rank then waits in its own collective and a PeerTimeout names the ranks that never
joined it. The cost per call is a dictionary look-up, where a sequence number checked by a second small reduction
would add a reduction's latency to every call (doubling that of small ones); the price is that a mismatch is found
at the timeout, not at once, and that two calls of the same kind (two ``average_params`` against one) still match
as before."""


class Request(ABC):
    """One pending nonblocking send or receive, with what it is waiting for (for error messages)."""

    def __init__(self, kind: str, peer: int, tag: int, nbytes: int) -> None:
        self.kind = kind
        self.peer = peer
        self.tag = tag
        self.nbytes = nbytes
        self.done = False

    @abstractmethod
    def test(self) -> bool:
        """Advance the operation if possible; True once it has completed."""

    def cancel(self) -> None:
        """Give up on a receive that will never be matched (after a timeout); sends cannot be cancelled."""
        self.done = True

    def awaited(self) -> tuple[int, ...]:
        """The ranks this request still waits for, for a timeout's message (a collective: those not yet in it)."""
        return (self.peer,)

    def describe(self) -> str:
        direction = "to" if self.kind == "send" else "from"
        return f"{self.kind} of {self.nbytes} bytes {direction} rank {self.peer} (tag {self.tag})"


class Engine(ABC):
    """The core protocol: rank, size, timeout, point-to-point buffers, the collectives FAST needs, and new engines
    over the same ranks (dup, split). What some engines can do besides (survive a lost rank, run on virtual time,
    count their traffic) are capabilities, asked for by type (``fast_core.engine.capabilities``)."""

    rank: int
    size: int
    timeout: float
    """Seconds any wait on a peer may last before a PeerTimeout names the peer (``math.inf``: wait forever)."""
    name: str = "engine"
    threads_supported: bool = True
    """Whether a background thread may communicate while the trainer does (MPI: MPI_THREAD_MULTIPLE granted);
    asynchronous strategies refuse to start without it."""
    thread_level: str = "threads"
    """What the engine was granted, for error messages (MPI: the thread level's name, like MPI_THREAD_SINGLE)."""

    @abstractmethod
    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Request:
        """Start sending a contiguous buffer; it must not change until the request completes."""

    @abstractmethod
    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Request:
        """Start receiving into a contiguous buffer of exactly the size the peer sends."""

    @abstractmethod
    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        """Reduce ``buf`` across all ranks, in place; ``kind`` (one of COLLECTIVE_KINDS) keeps it from matching a
        collective of another kind."""

    def iallreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> Request:
        """Start reducing ``buf`` across all ranks, in place; it holds the result once the request is waited
        (``wait``/``wait_all``, with the engine's timeout naming the ranks not yet in it). ``buf`` must not be read
        or changed until then. Every rank posts the same collectives in the same order (``kind`` as for allreduce);
        several may be in flight and waited in any order. Why: Streaming DiLoCo's overlap trains on while its
        exchange is under way."""
        raise NotImplementedError(
            f"the {self.name} engine ({type(self).__name__}) has no nonblocking all-reduce; use MPIEngine or "
            "LocalEngine (or implement Engine.iallreduce for it)"
        )

    @abstractmethod
    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        """Overwrite ``buf`` on every rank with root's ``buf``; ``kind`` as for allreduce."""

    def broadcast_text(self, text: str, root: int = 0) -> str:
        """``root``'s ``text`` on every rank (collective: its length, then its UTF-8 bytes; others' text is unused)."""
        raw = text.encode() if self.rank == root else b""
        length = np.array([len(raw)], dtype=np.int64)
        self.broadcast(length, root)
        buffer = np.zeros(int(length[0]), dtype=np.uint8)
        if self.rank == root:
            buffer[:] = np.frombuffer(raw, dtype=np.uint8)
        if buffer.size:
            self.broadcast(buffer, root)
        return buffer.tobytes().decode(errors="replace")

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""

    @abstractmethod
    def ibarrier(self) -> Request:
        """Nonblocking barrier: the request completes once every rank has entered it."""

    @abstractmethod
    def dup(self, timeout: float | None = None) -> Engine:
        """A new engine over the same ranks whose messages and collectives never mix with this one's.

        Collective: every rank must call it. A background communication thread gets its own this way.
        """

    def split(self, color: int) -> Engine:
        """A new engine over the ranks that passed the same ``color`` (an int >= 0), numbered in this engine's rank
        order, with this engine's timeout; its messages and collectives never mix with this one's.

        Collective: every rank must call it. Why: a pipeline stage's replicas average their parameters among
        themselves (``fast_core.pipeline.replica_group``) while the stages talk on the whole job's engine."""
        raise NotImplementedError(
            f"the {self.name} engine ({type(self).__name__}) cannot split into groups; use MPIEngine or LocalEngine "
            "(or implement Engine.split for it)"
        )

    def free(self) -> None:  # noqa: B027 - most engines hold nothing to release
        """Release what the engine holds (the MPI communicators it made; collective there), once it is no longer
        used: an engine from ``split`` or ``dup`` that lives until the end would otherwise be reported pending at
        MPI_Finalize."""

    def check_alive(self) -> None:  # noqa: B027 - optional hook, most engines have nothing to check
        """Raise when waiting on a peer is pointless: a failed rank of an in-process cluster (PeerFailed), a lost
        rank of a fault-tolerant group (PeerLost). Every wait polls it, so a wait ends before its timeout when the
        engine knows the peer will never come; engines that cannot tell have nothing to check."""

    def wait(self, request: Request, timeout: float | None = None) -> None:
        self.wait_all((request,), timeout)

    def wait_all(self, requests: Iterable[Request], timeout: float | None = None) -> None:
        """Complete every request or raise PeerTimeout naming the peers still awaited."""
        pending = [r for r in requests if not r.done]
        seconds = self.timeout if timeout is None else timeout
        patience = Patience(seconds)
        while pending:
            pending = [r for r in pending if not r.test()]
            if not pending:
                return
            self.check_alive()
            if patience.expired():
                raise timeout_error(self.rank, pending, seconds)
            patience.rest()

    def exchange(
        self,
        send: np.ndarray,
        dests: Sequence[int],
        recvs: Sequence[np.ndarray],
        sources: Sequence[int],
        tag: int = 0,
    ) -> list[Request]:
        """Post receives from ``sources`` into ``recvs`` and sends of ``send`` to ``dests``; returns the requests."""
        requests = [self.irecv(buf, src, tag) for buf, src in zip(recvs, sources, strict=True)]
        requests += [self.isend(send, dst, tag) for dst in dests]
        return requests

    def check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"rank {peer} does not exist: this job has ranks 0..{self.size - 1}")
        if peer == self.rank:
            raise ValueError(f"rank {peer} cannot message itself; a strategy mixes its own buffer locally")


class Patience:
    """How a wait polls: back to back at first (large MPI messages progress only inside MPI calls, and even a
    1 us sleep costs ~80 us of Linux timer slack), then yielding the core between polls (ranks sharing cores
    need it: spinning made a 4-rank allreduce on 2 cores 50x slower), then sleeping, so a long wait idles."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self.polls = 0
        self.pause = 0.0

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def rest(self) -> None:
        self.polls += 1
        if self.polls <= SPIN_POLLS:
            return
        if time.monotonic() - self.start < YIELD_SECONDS:
            os.sched_yield()
            return
        time.sleep(self.pause)
        self.pause = min(1e-3, self.pause * 2 + 5e-5)


def check_tag(tag: int) -> None:
    if not 0 <= tag < MAX_USER_TAG:
        raise ValueError(f"tag {tag} is outside 0..{MAX_USER_TAG - 1} (higher tags are reserved by FAST)")


def deliver(rank: int, request: Request, data: np.ndarray, buf: np.ndarray) -> None:
    """Copy a received message into the receive buffer, or MessageError when the two ranks disagree on its layout
    (in-process engines: MPI checks it itself)."""
    if data.nbytes != buf.nbytes or data.dtype != buf.dtype:
        raise MessageError(
            f"rank {rank} expected {buf.nbytes} bytes of {buf.dtype} from rank {request.peer} (tag {request.tag}) "
            f"but received {data.nbytes} bytes of {data.dtype}: the two ranks disagree on the message layout"
        )
    np.copyto(buf, data.reshape(buf.shape))
    request.done = True


def check_color(color: int) -> None:
    if isinstance(color, bool) or not isinstance(color, int | np.integer) or color < 0:
        raise ValueError(f"split color {color!r} must be an int >= 0 (ranks with the same color form one group)")


def check_kind(kind: str | None) -> None:
    if kind is not None and kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; use one of {COLLECTIVE_KINDS} (or None)")


def check_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduction '{op}'; use one of {REDUCE_OPS}")


def check_contiguous(buf: np.ndarray, what: str) -> None:
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
        raise TypeError(f"{what} needs a C-contiguous NumPy array, got {type(buf).__name__}")


def timeout_error(rank: int, pending: Sequence[Request], seconds: float) -> PeerTimeout:
    peers = tuple(sorted({peer for r in pending for peer in r.awaited()}))
    what = "; ".join(r.describe() for r in pending[:4])
    more = f" (+{len(pending) - 4} more)" if len(pending) > 4 else ""
    return PeerTimeout(
        f"rank {rank} waited {seconds:g} s for rank(s) {list(peers)}: {what}{more}. The peer may be slower, stuck, "
        "dead, or running a different number of steps; raise the timeout (FAST_TIMEOUT) if it is only slow",
        ranks=peers,
    )
