"""Gossiping SGD (Jin et al. 2016): after its local step a worker averages with one uniformly random rank.

pull: worker i picks j among all N ranks (itself included: then nothing changes) and sets x_i <- (x_i + x_j) / 2.
push: worker i sends x_i to a random j (itself: nothing is sent); each worker then takes the count-normalised
      average of its own x_i and every x that arrived: x_i <- (x_i + sum received) / (1 + number received).
Both keep the mean of the workers in expectation only (a worker's value may be counted more than once).

Synchronous (the default): every rank draws the whole step's choice vector from one generator seeded by
(seed, step), so each knows whom it sends to and whom it hears from, and x_j is j's value after j's own step.

Asynchronous (``synchronous=False``): one random peer per step, and the trainer never waits. A background
thread (a CommThread, as the Mailbox uses) moves the data while the trainer computes. The Mailbox itself does
not fit: it sends every post to all of its dests (O(N) traffic per step on the complete graph) and keeps a
model-sized receive posted from every source (O(N) memory). Instead a push is announced by an 8-byte notice and
the model-sized receive is posted only when a notice arrives; a pull asks with an 8-byte request that the
peer's thread answers with the newest parameters its trainer published. Memory stays a few model-sized buffers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from ..comm_thread import CommThread
from ..engine import Engine, Request
from ..errors import ConfigError, PeerTimeout
from ..metrics import Metrics
from ..mixing import axpy
from .base import Strategy

if TYPE_CHECKING:
    from ..worker import Worker

VARIANTS = ("pull", "push")
TAG = 43
"""Message tag of synchronous gossip, apart from other strategies' traffic on the same engine."""

_HEADER = 16  # bytes before the payload of an asynchronous message: int64 step, int64 sequence number
_NOTICE_TAG, _PAYLOAD_TAG = 1, 2  # push: "a payload follows", then the payload
_ASK_TAG, _REPLY_TAG = 3, 4  # pull: "send me your parameters", then the parameters


def peer_choices(seed: int, step: int, size: int) -> np.ndarray:
    """c[i] is the rank worker i gossips with at ``step``: uniform over all ``size`` ranks, itself included.

    Every rank computes the same vector, which is what lets the synchronous variants post exactly the right
    sends and receives without asking anyone.
    """
    return np.random.default_rng((seed, step)).integers(0, size, size=size)


def _average_into(params: np.ndarray, others: list[np.ndarray]) -> None:
    """params <- (params + sum(others)) / (1 + len(others)), in place."""
    for x in others:
        axpy(1.0, x, params)
    params *= 1.0 / (1 + len(others))


class Gossip(Strategy):
    """Pull- or push-gossip with one uniformly random rank per step, synchronous (seeded) or asynchronous."""

    name = "gossip"
    bare_option = "variant"  # "gossip:push" in a strategy string

    def __init__(self, variant: str = "pull", synchronous: bool = True, seed: int = 0) -> None:
        if variant not in VARIANTS:
            raise ConfigError(f"gossip variant must be 'pull' or 'push', got {variant!r}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"gossip seed must be an integer >= 0 (all ranks must give the same), got {seed!r}")
        self.variant = variant
        self.synchronous = bool(synchronous)
        self.seed = int(seed)

    def setup(self, worker: Worker) -> None:
        if self.synchronous:
            self._send = worker.layout.empty()
            self._pool: list[np.ndarray] = []  # receive buffers, grown to the most arrivals seen in one step
            return
        self._rng = np.random.default_rng((self.seed, worker.rank))
        params = worker.model.params()
        box = _PullBox if self.variant == "pull" else _PushBox
        self._box = box(worker.engine, params, worker.step, worker.metrics)

    def after_step(self, worker: Worker) -> None:
        if worker.size == 1:
            return
        if self.synchronous:
            self._sync_step(worker)
        elif self.variant == "pull":
            self._pull_async(worker)
        else:
            self._push_async(worker)

    def close(self, worker: Worker) -> None:
        if not self.synchronous:
            self._box.close()

    # synchronous ------------------------------------------------------------------------------------------------
    def _receive_buffers(self, worker: Worker, count: int) -> list[np.ndarray]:
        while len(self._pool) < count:
            self._pool.append(worker.layout.empty())
        return self._pool[:count]

    def _sync_step(self, worker: Worker) -> None:
        rank = worker.rank
        choice = peer_choices(self.seed, worker.step, worker.size)
        target = int(choice[rank])
        chosen_by = [int(k) for k in np.flatnonzero(choice == rank) if k != rank]
        partner = [target] if target != rank else []
        sources, dests = (partner, chosen_by) if self.variant == "pull" else (chosen_by, partner)
        if not sources and not dests:
            return
        params = worker.model.params()
        if dests:
            np.copyto(self._send, params)
        recvs = self._receive_buffers(worker, len(sources))
        worker.wait_all(worker.exchange(self._send, dests, recvs, sources, TAG))
        if recvs:
            _average_into(params, recvs)
            worker.model.set_params(params)

    # asynchronous -----------------------------------------------------------------------------------------------
    def _draw_peer(self, worker: Worker) -> int | None:
        peer = int(self._rng.integers(0, worker.size))
        return None if peer == worker.rank else peer

    def _pull_async(self, worker: Worker) -> None:
        box: _PullBox = self._box
        params = worker.model.params()
        reply = box.take()
        if reply is not None:
            payload, step = reply
            _average_into(params, [payload])
            worker.model.set_params(params)
            worker.metrics.record_staleness(max(0, worker.step - step))
        box.publish(params, worker.step)
        if box.idle():  # at most one pull in flight: a new peer only once the last answer was used
            peer = self._draw_peer(worker)
            if peer is not None:
                box.fetch(peer)

    def _push_async(self, worker: Worker) -> None:
        box: _PushBox = self._box
        params = worker.model.params()
        peer = self._draw_peer(worker)
        if peer is not None:
            box.push(params, worker.step, peer)  # skipped while the previous push has not left yet
        arrived = box.take_all()
        if arrived:
            _average_into(params, [payload for payload, _ in arrived])
            worker.model.set_params(params)
            for _, step in arrived:
                worker.metrics.record_staleness(max(0, worker.step - step))


# background threads of the asynchronous variants ---------------------------------------------------------------


class _GossipThread(CommThread):
    """Shared parts: message slots of header + payload, and one small always-posted receive per peer."""

    def __init__(self, engine: Engine, params: np.ndarray, name: str, metrics: Metrics, small_tag: int) -> None:
        super().__init__(engine, name, metrics)
        self.dtype = params.dtype
        self._slot_bytes = _HEADER + params.nbytes
        self.buffers = 0  # model-sized slots allocated so far: a handful, however long training runs
        self._peers = [p for p in range(engine.size) if p != engine.rank]
        self._one = np.ones(1, dtype=np.int64)  # the body of every small message; never written
        self._small = {p: np.zeros(1, dtype=np.int64) for p in self._peers}
        self._small_tag = small_tag
        self._small_requests = {p: self.engine.irecv(self._small[p], p, small_tag) for p in self._peers}

    def _slot(self) -> np.ndarray:
        self.buffers += 1
        return np.zeros(self._slot_bytes, dtype=np.uint8)

    @staticmethod
    def _write(slot: np.ndarray, params: np.ndarray, step: int, sequence: int) -> None:
        slot[:_HEADER].view(np.int64)[:] = (step, sequence)
        slot[_HEADER:] = np.ascontiguousarray(params).reshape(-1).view(np.uint8)

    def _read(self, slot: np.ndarray) -> tuple[np.ndarray, int]:
        return slot[_HEADER:].view(self.dtype), int(slot[:_HEADER].view(np.int64)[0])

    def _small_arrivals(self) -> list[int]:
        """Peers whose small message (notice or request) arrived, once per message; receives are reposted."""
        arrived = []
        for peer in self._peers:
            while self._small_requests[peer].test():
                arrived.append(peer)
                self._small_requests[peer] = self.engine.irecv(self._small[peer], peer, self._small_tag)
        self.metrics.bytes_received += 8 * len(arrived)
        self.metrics.messages_received += len(arrived)
        return arrived

    def _send_small(self, peer: int, tag: int) -> Request:
        self.metrics.bytes_sent += 8
        self.metrics.messages_sent += 1
        return self.engine.isend(self._one, peer, tag)

    def _cancel_small(self) -> None:
        for request in self._small_requests.values():
            request.cancel()


class _PushBox(_GossipThread):
    """Send the trainer's pushes one at a time; collect every push that arrives, newest per sender.

    One push is in flight and one staged at most: a push made while the slot is still staged is skipped, so a
    slow link lowers the push rate instead of queueing stale parameters.
    """

    def __init__(self, engine: Engine, params: np.ndarray, step: int, metrics: Metrics) -> None:
        super().__init__(engine, params, "gossip-push", metrics, _NOTICE_TAG)
        self._staged, self._outgoing = self._slot(), self._slot()
        self._staged_dest: int | None = None
        self._sequence = 0
        self._sends: list[Request] = []
        self._sends_started = 0.0
        self._incoming: list[tuple[int, Request, np.ndarray]] = []  # payload receives posted after a notice
        self._arrived: dict[int, np.ndarray] = {}  # newest unread push per sender
        self._current: list[np.ndarray] = []  # held by the trainer until its next take_all
        self._pool: list[np.ndarray] = []
        self.skipped = 0  # pushes not made because the previous one had not left
        self.superseded = 0  # pushes replaced by a newer one from the same sender before the trainer read them
        self._start()

    # trainer side
    def push(self, params: np.ndarray, step: int, dest: int) -> bool:
        """Stage a copy of ``params`` for ``dest``; False (nothing copied) while the last push is still staged."""
        self._raise_if_failed()
        with self._cond:
            if self._staged_dest is not None:
                self.skipped += 1
                return False
            slot = self._staged  # the thread swaps it only once _staged_dest is set below
        self._sequence += 1
        self._write(slot, params, step, self._sequence)
        with self._cond:
            self._staged_dest = dest
        return True

    def take_all(self) -> list[tuple[np.ndarray, int]]:
        """(payload, sender's step) of every push received since the last call; valid until the next call."""
        self._raise_if_failed()
        with self._cond:
            self._pool.extend(self._current)
            self._current = list(self._arrived.values())
            self._arrived.clear()
        return [self._read(slot) for slot in self._current]

    # thread side
    def _fresh(self) -> np.ndarray:
        with self._cond:
            return self._pool.pop() if self._pool else self._slot()

    def _progress(self) -> bool:
        return self._receive() | self._send()

    def _receive(self) -> bool:
        notices = self._small_arrivals()
        for peer in notices:
            slot = self._fresh()
            self._incoming.append((peer, self.engine.irecv(slot, peer, _PAYLOAD_TAG), slot))
        done = [entry for entry in self._incoming if entry[1].test()]
        if done:
            self._incoming = [entry for entry in self._incoming if not entry[1].done]
            with self._cond:
                for peer, _, slot in done:
                    older = self._arrived.pop(peer, None)
                    if older is not None:
                        self._pool.append(older)
                        self.superseded += 1
                    self._arrived[peer] = slot
            self.metrics.bytes_received += self._slot_bytes * len(done)
            self.metrics.messages_received += len(done)
        return bool(notices or done)

    def _send(self) -> bool:
        if self._sends:
            if not self._check_delivery(self._sends, self._sends_started):
                return False
            self._sends = []
        if self._closing:
            return False  # a push staged but not sent is dropped: nobody waits for it
        with self._cond:
            dest = self._staged_dest
            if dest is None:
                return False
            self._staged, self._outgoing = self._outgoing, self._staged
            self._staged_dest = None
        self._sends = [self._send_small(dest, _NOTICE_TAG), self.engine.isend(self._outgoing, dest, _PAYLOAD_TAG)]
        self._sends_started = time.monotonic()
        self.metrics.bytes_sent += self._slot_bytes
        self.metrics.messages_sent += 1
        return True

    def _ready_to_close(self) -> bool:
        return not self._sends

    def _shutdown(self) -> None:
        # every rank's sends completed before the closing barrier did: take in (and count) what is already here
        while self._receive() or self._incoming:
            self.engine.wait_all([request for _, request, _ in self._incoming])
        self._cancel_small()


class _PullBox(_GossipThread):
    """Answer every peer's request with the newest published parameters; fetch one peer's at a time.

    The trainer publishes a copy of its parameters each step into a staged slot; the thread swaps it into the
    serving slot between answers, so a peer always gets a consistent snapshot, at most one batch of answers old.
    """

    def __init__(self, engine: Engine, params: np.ndarray, step: int, metrics: Metrics) -> None:
        super().__init__(engine, params, "gossip-pull", metrics, _ASK_TAG)
        self._staged, self._serving = self._slot(), self._slot()
        self._staged_sequence = self._serving_sequence = 0
        self._answers: list[Request] = []
        self._answers_started = 0.0
        self._askers: list[int] = []
        self._reply = self._slot()
        self._wanted: int | None = None  # set by the trainer, turned into an ask by the thread
        self._ask: list[Request] = []  # the ask sent and the reply receive, while a fetch is in flight
        self._ask_started = 0.0
        self._reply_ready = False
        self.publish(params, step)
        self._start()

    # trainer side
    def publish(self, params: np.ndarray, step: int) -> None:
        """Make a copy of ``params`` the answer to the next requests."""
        self._raise_if_failed()
        with self._cond:
            self._staged_sequence += 1
            self._write(self._staged, params, step, self._staged_sequence)

    def idle(self) -> bool:
        """True when no fetch is asked, in flight, or answered and unread."""
        with self._cond:
            return self._wanted is None and not self._ask and not self._reply_ready

    def fetch(self, peer: int) -> None:
        """Ask ``peer`` for its parameters; take() returns them once they arrived. Only when idle()."""
        self._raise_if_failed()
        with self._cond:
            self._wanted = peer

    def take(self) -> tuple[np.ndarray, int] | None:
        """(parameters, their step) of the last fetch once arrived, exactly once; valid until the next fetch."""
        self._raise_if_failed()
        with self._cond:
            if not self._reply_ready:
                return None
            self._reply_ready = False
        return self._read(self._reply)

    # thread side
    def _progress(self) -> bool:
        return self._answer() | self._fetch()

    def _answer(self) -> bool:
        askers = self._small_arrivals()
        self._askers.extend(askers)
        if self._answers:
            if not self._check_delivery(self._answers, self._answers_started):
                return bool(askers)
            self._answers = []
        if not self._askers:
            return bool(askers)
        with self._cond:
            if self._staged_sequence > self._serving_sequence:
                self._staged, self._serving = self._serving, self._staged
                self._serving_sequence = self._staged_sequence
        self._answers = [self.engine.isend(self._serving, peer, _REPLY_TAG) for peer in self._askers]
        self._answers_started = time.monotonic()
        self.metrics.bytes_sent += self._slot_bytes * len(self._askers)
        self.metrics.messages_sent += len(self._askers)
        self._askers = []
        return True

    def _fetch(self) -> bool:
        if self._ask:
            if not all(request.test() for request in self._ask):
                if time.monotonic() - self._ask_started > self.engine.timeout:
                    peer = self._ask[0].peer
                    raise PeerTimeout(
                        f"rank {self.rank}: {self.name} asked rank {peer} for its parameters and had no answer "
                        f"within {self.engine.timeout:g} s; it may be dead or stuck",
                        ranks=(peer,),
                    )
                return False
            self._ask = []
            self.metrics.bytes_received += self._slot_bytes
            self.metrics.messages_received += 1
            with self._cond:
                self._reply_ready = True
            return True
        with self._cond:
            peer, self._wanted = self._wanted, None
        if peer is None or self._closing:
            return False
        # the reply receive is posted before the ask, so the answer always finds it
        self._ask = [self.engine.irecv(self._reply, peer, _REPLY_TAG), self._send_small(peer, _ASK_TAG)]
        self._ask_started = time.monotonic()
        return True

    def _ready_to_close(self) -> bool:
        return not self._ask and not self._answers and not self._askers

    def _shutdown(self) -> None:
        # an ask answered after this rank entered the closing barrier was received before the barrier completed
        self.engine.wait_all(self._answers)
        self._cancel_small()
