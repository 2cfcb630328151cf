"""A background communication thread that keeps the freshest message from each neighbour.

Asynchronous strategies must never block the trainer on the network. A Mailbox's thread (a CommThread) keeps
a receive posted from every in-neighbour, queues each completed message with its step number, and sends the
trainer's latest posted payload to every out-neighbour as soon as the previous sends completed.

The trainer only copies its payload in (``post``) and swaps the newest message out (``take``); it waits only
when a strategy asks it to (``wait_for``: a staleness bound), and that wait has a timeout that names the
neighbour. Each message is one slot of ``framing`` (a 16-byte header of step and sequence number, then the
payload); nothing is pickled. With a ``codec`` (``fast_core.compression``) the payload is the codec's bytes: the
sender encodes once per post, for every out-neighbour, and the receiver decodes a message once, seeded by the
sender's rank and the step in its header (``compression.wire``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fast_core.compression.codecs import Codec
from fast_core.compression.wire import PlainEncoding, encoding_for, message_seed
from fast_core.engine import Engine, Request
from fast_core.engine.capabilities import count_wait
from fast_core.errors import PeerTimeout
from fast_core.transport import framing
from fast_core.transport.comm_thread import CommThread
from fast_core.transport.tags import MailboxTag

INLINE_MAX_BYTES = 1 << 20
"""The largest message (encoded payload) whose mailbox runs its turns on the trainer's calls by default. Such a
message crosses in one or a few MPI calls (shared memory; a socket's buffers, which hold a few MB), so the sender's
post and the receiver's next take move it, and no thread need poll. Measured on 2 shared cores
(benchmarks/model_check.py, async:ring against a thread): inline as fast or faster for 38 kB to 19 MB messages, by
26% at 307 kB on 4 ranks. Above it a thread moves the message while the trainer computes: over a network, a message
of many megabytes needs progress calls all along its way."""


@dataclass
class Message:
    """The newest message of one neighbour as the trainer sees it."""

    payload: np.ndarray  # the values: a view of the trainer-owned slot (decoded, with a codec); valid until the
    # next take() of the same peer
    step: int  # the sender's step when it posted the payload
    sequence: int  # 1, 2, ... per sender; lets a strategy tell a new message from one it already used
    fresh: bool  # True when this take() returned a message not seen before


class _Inbox:
    """Buffers of one neighbour: MPI writes ``landing``; the thread queues completed ones in ``ready`` (at most
    ``depth``, oldest dropped); the trainer holds ``current`` until its next take, or until it releases them.
    Buffers move by reference and are recycled through ``pool``, so the steady state allocates nothing and copies
    nothing twice. ``limit``: the most buffers ever allocated (None: as many as needed, depth + 2 at most); when
    all are in use the thread waits for the trainer's release before it receives again."""

    def __init__(self, payload_bytes: int, depth: int, limit: int | None) -> None:
        self.payload_bytes = payload_bytes
        self.depth = depth
        self.limit = limit
        self.allocated = 0
        self.pool: list[np.ndarray] = []
        self.landing: np.ndarray | None = self.fresh_buffer()
        self.ready: deque[np.ndarray] = deque()
        self.current: list[np.ndarray] = []
        self.taken = framing.NO_MESSAGE  # (step, sequence) of the newest message the trainer took
        self.request: Request | None = None
        self.finished_flag = np.zeros(1, dtype=np.int64)
        self.finished_request: Request | None = None
        self.finished = False  # the neighbour closed its mailbox: it will send nothing more

    def fresh_buffer(self) -> np.ndarray | None:
        """A buffer to receive into: a recycled one, a new one, or None when ``limit`` are all in use."""
        if self.pool:
            return self.pool.pop()
        if self.limit is not None and self.allocated >= self.limit:
            return None
        self.allocated += 1
        return framing.allocate(self.payload_bytes)

    def newest(self) -> tuple[int, int]:
        """(step, sequence) of the newest message arrived, taken or not."""
        return framing.header(self.ready[-1]) if self.ready else self.taken


class Mailbox(CommThread):
    """Send the latest payload to out-neighbours, keep the newest payload from each in-neighbour.

    Collective to create (it dups the engine so its messages never mix with the trainer's): every rank must
    build its mailboxes in the same order. ``gate=True`` sends the next payload only after a message from every
    in-neighbour has arrived since the last send (FAST's rule: one gradient per neighbour round trip).
    ``depth`` is how many unread messages per neighbour are kept (1: only the newest matters, as for
    parameters; more: every message should be used once, as for FAST's gradients, read with ``take_all``).
    ``codec`` (None: the values as they are) is what the messages travel as, through an error-feedback residual
    with ``feedback=True`` (``fast_core.compression.wire``). ``releases=True``: the trainer gives each take's
    buffers back as soon as it has used them (``release``), so a neighbour needs ``depth + 1`` model-sized buffers
    instead of ``depth + 2``; the thread receives nothing from that neighbour while the trainer holds them.
    ``inline`` (None: when a message is at most ``INLINE_MAX_BYTES``) runs the turns on the trainer's thread at its
    calls instead of a thread of its own (``drivers.InlineDriver``).
    """

    idle_pause = 5e-3  # a message noticed up to 5 ms late is only fresher at the next step: nobody waits on it

    def __init__(
        self,
        engine: Engine,
        sources: Sequence[int],
        dests: Sequence[int],
        size: int,
        dtype: np.dtype | str,
        *,
        codec: Codec | None = None,
        feedback: bool = False,
        gate: bool = False,
        depth: int = 1,
        releases: bool = False,
        inline: bool | None = None,
        name: str = "mailbox",
    ) -> None:
        self.encoding = encoding_for(codec, size, dtype, feedback)
        if inline is None:
            inline = self.encoding.payload_bytes <= INLINE_MAX_BYTES
        super().__init__(engine, name, inline=inline)
        self.sources = list(sources)
        self.dests = list(dests)
        self.dtype = np.dtype(dtype)
        self.gate = gate
        self._payload_bytes = self.encoding.payload_bytes
        self._decoded: dict[int, tuple[int, np.ndarray]] = {}  # per peer: (sequence, values) of its newest take
        self._staged = framing.allocate(self._payload_bytes)
        self._outgoing = framing.allocate(self._payload_bytes)
        self._staged_sequence = 0
        self._sent_sequence = 0
        self._sends: list[Request] = []
        self._sends_started = 0.0
        limit = depth + 1 if releases else None
        self._inboxes = {peer: _Inbox(self._payload_bytes, depth, limit) for peer in self.sources}
        self._heard_since_send = set(self.sources)  # the first send is never gated
        self._finish_flag = np.ones(1, dtype=np.int64)
        self._finish_sends: list[Request] | None = None
        for peer, inbox in self._inboxes.items():
            inbox.request = self.engine.irecv(inbox.landing, peer, MailboxTag.PAYLOAD)
            inbox.finished_request = self.engine.irecv(inbox.finished_flag, peer, MailboxTag.FINISHED)
        self._start()

    # trainer side -------------------------------------------------------------------------------------------
    def post(self, payload: np.ndarray, step: int) -> None:
        """Stage a copy of ``payload`` (encoded, with a codec) as this rank's newest message; the thread sends it
        when it can."""
        self._raise_if_failed()
        flat = self.encoding.flat(payload, self.name)
        encoded = self.encoding.encode(flat, message_seed(step, self.rank, self.engine.size))
        with self._cond:
            self._staged_sequence += 1
            framing.write(self._staged, encoded, step, self._staged_sequence)
        self._nudge()

    def last_posted(self) -> np.ndarray | None:
        """The values of the newest ``post``, valid until the next one (the staged or outgoing message, which only
        ``post`` writes): a strategy that needs what it last sent keeps no copy of its own. None with a codec,
        whose bytes are not the values."""
        if not isinstance(self.encoding, PlainEncoding) or self._staged_sequence == 0:
            return None
        with self._cond:
            newest = self._staged if self._staged_sequence != self._sent_sequence else self._outgoing
        return framing.payload(newest, self.encoding.payload_dtype)

    @property
    def buffers(self) -> int:
        """Message-sized buffers this mailbox holds: the staged and the outgoing message, and each neighbour's."""
        with self._cond:
            return 2 + sum(inbox.allocated for inbox in self._inboxes.values())

    def release(self, peer: int) -> None:
        """The trainer is done with what it took from ``peer``: its buffers go back to the thread (a message taken
        earlier must not be read after this)."""
        inbox = self._inboxes[peer]
        with self._cond:
            inbox.pool.extend(inbox.current)
            inbox.current = []
            self._decoded.pop(peer, None)
        self._nudge()

    def take(self, peer: int) -> Message | None:
        """The newest message of ``peer`` (None before its first); older unread ones are skipped. Never blocks.
        A message is decoded once, however many times it is taken."""
        fresh = self._swap_out(peer, newest_only=True)
        inbox = self._inboxes[peer]
        if not inbox.current:
            return None
        message = self._read(peer, inbox.current[-1], fresh=bool(fresh), decode=False)
        sequence, values = self._decoded.get(peer, (0, None))
        if sequence != message.sequence or values is None:
            values = self._decode(peer, message)
            self._decoded[peer] = (message.sequence, values)
        message.payload = values
        return message

    def take_all(self, peer: int) -> list[Message]:
        """Every message of ``peer`` not read before, oldest first (up to ``depth``), each decoded into its own
        array with a codec. Never blocks."""
        return [self._read(peer, slot, fresh=True) for slot in self._swap_out(peer, newest_only=False)]

    def _swap_out(self, peer: int, newest_only: bool) -> list[np.ndarray]:
        """The slots of ``peer`` not read before, now the trainer's (``current``); [] when none arrived."""
        self.poll()
        self._raise_if_failed()
        inbox = self._inboxes[peer]
        with self._cond:
            if not inbox.ready:
                return []
            inbox.pool.extend(inbox.current)
            if newest_only:
                inbox.pool.extend(list(inbox.ready)[:-1])
                inbox.current = [inbox.ready[-1]]
            else:
                inbox.current = list(inbox.ready)
            inbox.ready.clear()
            inbox.taken = framing.header(inbox.current[-1])
        return inbox.current

    def _read(self, peer: int, slot: np.ndarray, fresh: bool, decode: bool = True) -> Message:
        """The message in ``slot``: its payload decoded, or as it came (``decode=False``)."""
        message = Message(*framing.read(slot, self.encoding.payload_dtype), fresh=fresh)
        if decode:
            message.payload = self._decode(peer, message)
        return message

    def _decode(self, peer: int, message: Message) -> np.ndarray:
        return self.encoding.decode(message.payload, message_seed(message.step, peer, self.engine.size))

    def wait_for(self, peer: int, min_step: int) -> None:
        """Block until ``peer``'s newest message has step >= ``min_step`` (a staleness bound), or the peer has
        finished training (it will send nothing more, so it bounds nobody). The thread polls faster meanwhile.

        Raises PeerTimeout naming the peer after the engine's timeout.
        """
        inbox = self._inboxes[peer]
        start = time.monotonic()
        deadline = start + self.engine.timeout

        def satisfied() -> bool:
            step, sequence = inbox.newest()
            return inbox.finished or (sequence > 0 and step >= min_step)

        with self._cond:
            self._waiting += 1
            self._nudge()
            try:
                while not satisfied():
                    self._raise_if_failed()
                    self.engine.check_alive()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        step, sequence = inbox.newest()
                        raise PeerTimeout(
                            f"rank {self.rank} waited {self.engine.timeout:g} s for rank {peer} ({self.name}: wanted "
                            f"step >= {min_step}, newest has step {step}, message #{sequence}); the neighbour may "
                            "be stuck, dead or far slower; raise the timeout (FAST_TIMEOUT) or the staleness bound",
                            ranks=(peer,),
                        )
                    self._wait_on_thread(min(left, 0.05))
            finally:
                self._waiting -= 1
        count_wait(self.engine, time.monotonic() - start)

    # thread side ----------------------------------------------------------------------------------------------
    def _progress(self) -> bool:
        return self._receive() | self._send()

    def _ready_to_close(self) -> bool:
        if self._sends:
            return False
        if self._finish_sends is None:  # tell the neighbours not to wait for us any more
            self._finish_sends = [self.engine.isend(self._finish_flag, p, MailboxTag.FINISHED) for p in self.dests]
        return all(r.test() for r in self._finish_sends)

    def _shutdown(self) -> None:
        for inbox in self._inboxes.values():
            if inbox.landing is not None:  # else its last request completed and none is posted
                inbox.request.cancel()
            inbox.finished_request.cancel()

    def _receive(self) -> bool:
        progressed = False
        for peer, inbox in self._inboxes.items():
            if not inbox.finished and inbox.finished_request.test():
                with self._cond:
                    inbox.finished = True
                    self._heard_since_send.add(peer)
                    self._cond.notify_all()
                progressed = True
            if inbox.landing is None:  # every buffer was in use: receive again once the trainer released one
                with self._cond:
                    inbox.landing = inbox.fresh_buffer()
                if inbox.landing is not None:
                    inbox.request = self.engine.irecv(inbox.landing, peer, MailboxTag.PAYLOAD)
                    progressed = True
                continue
            if not inbox.request.test():
                continue
            with self._cond:
                inbox.ready.append(inbox.landing)
                if len(inbox.ready) > inbox.depth:
                    inbox.pool.append(inbox.ready.popleft())
                inbox.landing = inbox.fresh_buffer()
                self._heard_since_send.add(peer)
                self._cond.notify_all()
            if inbox.landing is not None:
                inbox.request = self.engine.irecv(inbox.landing, peer, MailboxTag.PAYLOAD)
            progressed = True
        return progressed

    def _send(self) -> bool:
        if self._sends:
            if not self._check_delivery(self._sends, self._sends_started):
                return False
            self._sends = []
        if self._closing or not self.dests:
            return False
        with self._cond:
            if self._staged_sequence == self._sent_sequence:
                return False
            if self.gate and len(self._heard_since_send) < len(self.sources):
                return False
            self._outgoing, self._staged = self._staged, self._outgoing
            self._sent_sequence = self._staged_sequence
            self._heard_since_send = {p for p, inbox in self._inboxes.items() if inbox.finished}
        self._sends = [self.engine.isend(self._outgoing, peer, MailboxTag.PAYLOAD) for peer in self.dests]
        self._sends_started = time.monotonic()
        return True
