"""The background threads of asynchronous gossip: a push box and a pull box (Jin et al. 2016's two variants).

The Mailbox does not fit gossip: it sends every post to all of its dests (O(N) traffic per step on the complete
graph) and keeps a model-sized receive posted from every source (O(N) memory). Instead a push is announced by an
8-byte notice and the model-sized receive is posted only when a notice arrives; a pull asks with an 8-byte request
that the peer's thread answers with the newest parameters its trainer published. Memory stays a few model-sized
buffers.
"""

from __future__ import annotations

import time

import numpy as np

from fast_core.compression.codecs import Codec
from fast_core.compression.wire import encoding_for
from fast_core.engine import Engine, Request
from fast_core.errors import PeerTimeout
from fast_core.transport import framing
from fast_core.transport.comm_thread import CommThread
from fast_core.transport.tags import GossipTag


class GossipThread(CommThread):
    """Shared parts: message slots of ``framing``, and one small always-posted receive per peer.

    With a ``codec`` (fast_core.compression, a dense one) the slots carry its bytes (``compression.wire``):
    parameters are encoded when the trainer pushes or publishes them and decoded when it takes them."""

    idle_pause = 5e-3  # a message noticed up to 5 ms late is only fresher at the next step: nobody waits on it

    def __init__(self, engine: Engine, params: np.ndarray, name: str, small_tag: int, codec: Codec | None) -> None:
        super().__init__(engine, name)
        self.dtype = params.dtype
        self.codec = codec
        self.encoding = encoding_for(codec, params.size, params.dtype)
        self.buffers = 0  # model-sized slots allocated so far: a handful, however long training runs
        self._peers = [p for p in range(engine.size) if p != engine.rank]
        self._one = np.ones(1, dtype=np.int64)  # the body of every small message; never written
        self._small = {p: np.zeros(1, dtype=np.int64) for p in self._peers}
        self._small_tag = small_tag
        self._small_requests = {p: self.engine.irecv(self._small[p], p, small_tag) for p in self._peers}

    def _slot(self) -> np.ndarray:
        self.buffers += 1
        return framing.allocate(self.encoding.payload_bytes)

    def _read(self, slot: np.ndarray) -> tuple[np.ndarray, int]:
        """(values, step) of the message in ``slot``: a view of the slot, or decoded from the codec's bytes."""
        payload, step, _ = framing.read(slot, self.encoding.payload_dtype)
        return self.encoding.decode(payload), step

    def _small_arrivals(self) -> list[int]:
        """Peers whose small message (notice or request) arrived, once per message; receives are reposted."""
        arrived = []
        for peer in self._peers:
            while self._small_requests[peer].test():
                arrived.append(peer)
                self._small_requests[peer] = self.engine.irecv(self._small[peer], peer, self._small_tag)
        return arrived

    def _send_small(self, peer: int, tag: int) -> Request:
        return self.engine.isend(self._one, peer, tag)

    def _cancel_small(self) -> None:
        for request in self._small_requests.values():
            request.cancel()


class PushBox(GossipThread):
    """Send the trainer's pushes one at a time; collect every push that arrives, newest per sender.

    One push is in flight and one staged at most: a push made while the slot is still staged is skipped, so a
    slow link lowers the push rate instead of queueing stale parameters.
    """

    def __init__(self, engine: Engine, params: np.ndarray, step: int, *, codec: Codec | None = None) -> None:
        super().__init__(engine, params, "gossip-push", GossipTag.NOTICE, codec)
        self._staged, self._outgoing = self._slot(), self._slot()
        self._staged_dest: int | None = None
        self._sequence = 0
        self._sends: list[Request] = []
        self._sends_started = 0.0
        self._incoming: list[tuple[int, Request, np.ndarray]] = []  # payload receives posted after a notice
        self._arrived: dict[int, np.ndarray] = {}  # newest unread push per sender
        self._current: list[np.ndarray] = []  # held by the trainer until its next take_all
        self._pool: list[np.ndarray] = []
        self._start()

    # trainer side
    def push(self, params: np.ndarray, step: int, dest: int) -> bool:
        """Stage a copy of ``params`` for ``dest``; False (nothing copied) while the last push is still staged."""
        self._raise_if_failed()
        with self._cond:
            if self._staged_dest is not None:
                return False
            slot = self._staged  # the thread swaps it only once _staged_dest is set below
        self._sequence += 1
        framing.write(slot, self.encoding.encode(params), step, self._sequence)
        with self._cond:
            self._staged_dest = dest
        self._nudge()
        return True

    def take_all(self) -> list[tuple[int, np.ndarray, int]]:
        """(sender, payload, sender's step) of every push received since the last call; valid until the next call."""
        self._raise_if_failed()
        with self._cond:
            self._pool.extend(self._current)
            senders, self._current = list(self._arrived), list(self._arrived.values())
            self._arrived.clear()
        return [(sender, *self._read(slot)) for sender, slot in zip(senders, self._current, strict=True)]

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
            self._incoming.append((peer, self.engine.irecv(slot, peer, GossipTag.PAYLOAD), slot))
        done = [entry for entry in self._incoming if entry[1].test()]
        if done:
            self._incoming = [entry for entry in self._incoming if not entry[1].done]
            with self._cond:
                for peer, _, slot in done:
                    older = self._arrived.pop(peer, None)
                    if older is not None:  # superseded before the trainer read it
                        self._pool.append(older)
                    self._arrived[peer] = slot
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
        notice = self._send_small(dest, GossipTag.NOTICE)
        self._sends = [notice, self.engine.isend(self._outgoing, dest, GossipTag.PAYLOAD)]
        self._sends_started = time.monotonic()
        return True

    def _ready_to_close(self) -> bool:
        return not self._sends

    def _shutdown(self) -> None:
        # every rank's sends completed before the closing barrier did: take in what is already here
        while self._receive() or self._incoming:
            self.engine.wait_all([request for _, request, _ in self._incoming])
        self._cancel_small()


class PullBox(GossipThread):
    """Answer every peer's request with the newest published parameters; fetch one peer's at a time.

    The trainer publishes a copy of its parameters each step into a staged slot; the thread swaps it into the
    serving slot between answers, so a peer always gets a consistent snapshot, at most one batch of answers old.
    """

    def __init__(self, engine: Engine, params: np.ndarray, step: int, *, codec: Codec | None = None) -> None:
        super().__init__(engine, params, "gossip-pull", GossipTag.ASK, codec)
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
        payload = self.encoding.encode(params)
        with self._cond:
            self._staged_sequence += 1
            framing.write(self._staged, payload, step, self._staged_sequence)

    def idle(self) -> bool:
        """True when no fetch is asked, in flight, or answered and unread."""
        with self._cond:
            return self._wanted is None and not self._ask and not self._reply_ready

    def fetch(self, peer: int) -> None:
        """Ask ``peer`` for its parameters; take() returns them once they arrived. Only when idle()."""
        self._raise_if_failed()
        with self._cond:
            self._wanted = peer
        self._nudge()

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
        self._answers = [self.engine.isend(self._serving, peer, GossipTag.REPLY) for peer in self._askers]
        self._answers_started = time.monotonic()
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
            with self._cond:
                self._reply_ready = True
            return True
        with self._cond:
            peer, self._wanted = self._wanted, None
        if peer is None or self._closing:
            return False
        # the reply receive is posted before the ask, so the answer always finds it
        self._ask = [self.engine.irecv(self._reply, peer, GossipTag.REPLY), self._send_small(peer, GossipTag.ASK)]
        self._ask_started = time.monotonic()
        return True

    def _ready_to_close(self) -> bool:
        return not self._ask and not self._answers and not self._askers

    def _shutdown(self) -> None:
        # an ask answered after this rank entered the closing barrier was received before the barrier completed
        self.engine.wait_all(self._answers)
        self._cancel_small()
