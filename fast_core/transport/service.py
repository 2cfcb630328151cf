"""Request/reply between ranks without involving the replier's trainer: AD-PSGD's pairs, EASGD's centre.

A RequestService's thread keeps a receive posted from every rank that may ask; when a request lands it calls
the strategy's handler (under the service lock) to fill the reply and sends it back. The same thread carries
this rank's own outstanding request, if any, so large messages progress while the trainer computes. No rank
ever waits on another rank's trainer, so no cycle of waits (and no deadlock) can form on any topology.

With a ``codec`` (``fast_core.compression``: AD-PSGD's and asynchronous EASGD's ``compress=``) requests and
replies travel as the codec's bytes; the handlers see decoded values as without one, and ``as_received(values)``
tells a strategy what its peer reads of a message it sends, so a pair can move by exactly opposite amounts (AD-PSGD
keeps the average of all workers exact under compression this way). A reply equal to the decoded request (an
echo: AD-PSGD's answer to crossed requests) goes back as the request's own bytes, so its sender recognises it
whatever the codec.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from fast_core.compression.codecs import Codec
from fast_core.compression.wire import Encoding, encoding_for
from fast_core.engine import Engine, Request
from fast_core.engine.capabilities import count_wait
from fast_core.errors import PeerTimeout
from fast_core.transport.comm_thread import CommThread
from fast_core.transport.tags import ServiceTag

Handler = Callable[[int, np.ndarray, np.ndarray], None]
"""handler(peer, request_payload, reply_out): fill ``reply_out``; runs on the service thread, under ``lock``."""
ReplyHandler = Callable[[int, np.ndarray], None]
"""on_reply(peer, reply): consume the reply to our own request on the service thread, under ``lock``."""


class RequestService(CommThread):
    """Answer requests of ``askers`` with ``handler``; send at most one request of our own at a time. Requests and
    replies are ``size`` values of ``dtype``, sent as ``codec``'s bytes when one is given. ``inline=True`` answers
    at the trainer's own calls, a backstop thread only every 20 ms when it makes none (``drivers.InlineDriver``):
    for small messages whose askers can wait a step of the replier (the shared budget's grants, asked ahead)."""

    def __init__(
        self,
        engine: Engine,
        askers: Sequence[int],
        size: int,
        dtype: np.dtype | str,
        handler: Handler | None,
        *,
        codec: Codec | None = None,
        on_reply: ReplyHandler | None = None,
        name: str = "service",
        start: bool = True,
        inline: bool = False,
    ) -> None:
        super().__init__(engine, name, inline=inline)
        self.dtype = np.dtype(dtype)
        self.size = size
        self.encoding = encoding_for(codec, size, dtype)
        self.lock = threading.Lock()
        """Held while the handler runs: take it to change state the handler reads."""
        if codec is not None:  # the handlers see values: decoded on the way in, encoded on the way out
            coded = _DecodedHandlers(self.encoding, handler, on_reply)
            handler = coded.handle if handler is not None else None
            on_reply = coded.take_reply if on_reply is not None else None
        self._handler = handler
        self._on_reply = on_reply
        self._incoming = {peer: self._payload() for peer in askers}
        self._replies = {peer: self._payload() for peer in askers}
        self._receives = {peer: self.engine.irecv(self._incoming[peer], peer, ServiceTag.REQUEST) for peer in askers}
        self._reply_sends: dict[int, tuple[Request, float]] = {}
        self._own_request = self._payload()
        self._own_reply = self._payload()
        self._asked = self.encoding.decode(self._own_request)  # our last request as the peer decodes it
        self._own_peer: int | None = None
        self._own_staged = False
        self._own_requests: list[Request] = []
        self._own_started = 0.0
        self._own_done = False
        if start:
            self.start()

    def start(self) -> None:
        """Start answering (only needed with ``start=False``, when handlers need the service object first)."""
        self._start()

    def _payload(self) -> np.ndarray:
        return np.zeros(self.encoding.payload_length, dtype=self.encoding.payload_dtype)

    # trainer side -------------------------------------------------------------------------------------------
    def ask(self, peer: int, payload: np.ndarray) -> None:
        """Send ``payload`` (encoded, with a codec) to ``peer`` as a request; collect the reply with ``reply``. One
        at a time."""
        self._raise_if_failed()
        encoded = self.encoding.encode(np.asarray(payload).reshape(-1))
        with self._cond:
            if self._own_peer is not None:
                raise RuntimeError(f"{self.name}: a request to rank {self._own_peer} is still unanswered")
            np.copyto(self._own_request, encoded)
            self._asked = self.encoding.decode(self._own_request)
            self._own_peer = peer
            self._own_staged = True
            self._own_done = False
            self._cond.notify_all()
        self._nudge()

    def as_received(self, values: np.ndarray) -> np.ndarray:
        """What a peer reads of ``values`` when this service sends them: ``values`` itself, or what the codec
        leaves of them (a new array)."""
        return self.encoding.as_received(values)

    @property
    def request_payload(self) -> np.ndarray:
        """Our last request as the peer decodes it (a copy of what we asked, without a codec), unchanged until the
        next ask."""
        return self._asked

    @property
    def pending(self) -> int | None:
        """The rank our unanswered request went to, or None."""
        return self._own_peer

    def outstanding_to(self, peer: int) -> bool:
        """True while our request to ``peer`` awaits its reply (for handlers: the two requests crossed)."""
        return self._own_peer == peer and not self._own_done

    @property
    def answered(self) -> bool:
        """True once the reply to our outstanding request arrived (``reply`` will not wait)."""
        self.poll()
        with self._cond:
            return self._own_done

    def reply(self) -> np.ndarray:
        """Wait for the reply to our request (its values: a buffer valid until the next ask).

        Only without ``on_reply``: with it, the thread consumes replies itself and ``pending`` clears on its own.
        Raises PeerTimeout naming the peer after the engine's timeout.
        """
        peer = self._own_peer
        if peer is None:
            raise RuntimeError(f"{self.name}: reply() without an outstanding ask()")
        start = time.monotonic()
        deadline = start + self.engine.timeout
        with self._cond:
            while not self._own_done:
                self._raise_if_failed()
                self.engine.check_alive()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerTimeout(
                        f"rank {self.rank} waited {self.engine.timeout:g} s for rank {peer} to answer its "
                        f"{self.name} request; that rank's communication thread is stuck or dead",
                        ranks=(peer,),
                    )
                self._wait_on_thread(min(left, 0.05))
            self._own_peer = None
        count_wait(self.engine, time.monotonic() - start)
        return self.encoding.decode(self._own_reply)

    # thread side ----------------------------------------------------------------------------------------------
    def _progress(self) -> bool:
        progressed = self._serve()
        progressed |= self._carry_own_request()
        for peer, (send, started) in list(self._reply_sends.items()):
            if self._check_delivery([send], started):
                del self._reply_sends[peer]
                progressed = True
        return progressed

    def _serve(self) -> bool:
        progressed = False
        for peer, receive in self._receives.items():
            if peer in self._reply_sends or not receive.test():
                continue  # a peer sends its next request only after our reply, so one reply buffer suffices
            with self.lock:
                self._handler(peer, self._incoming[peer], self._replies[peer])
            self._reply_sends[peer] = (self.engine.isend(self._replies[peer], peer, ServiceTag.REPLY), time.monotonic())
            self._receives[peer] = self.engine.irecv(self._incoming[peer], peer, ServiceTag.REQUEST)
            progressed = True
        return progressed

    def _carry_own_request(self) -> bool:
        with self._cond:
            staged, peer = self._own_staged, self._own_peer
            self._own_staged = False
        if staged:
            self._own_requests = [
                self.engine.irecv(self._own_reply, peer, ServiceTag.REPLY),
                self.engine.isend(self._own_request, peer, ServiceTag.REQUEST),
            ]
            self._own_started = time.monotonic()
            return True
        if self._own_requests and self._check_delivery(self._own_requests, self._own_started):
            self._own_requests = []
            if self._on_reply is not None:
                with self.lock:
                    self._on_reply(peer, self._own_reply)
            with self._cond:
                self._own_done = True
                if self._on_reply is not None:
                    self._own_peer = None
                self._cond.notify_all()
            return True
        return False

    def _ready_to_close(self) -> bool:
        # our own request must be answered and our replies delivered before we may stop serving
        return not self._own_requests and not self._own_staged and not self._reply_sends

    def _shutdown(self) -> None:
        for receive in self._receives.values():
            receive.cancel()


class _DecodedHandlers:
    """A coded service's handlers as the strategy wrote them, over values: each request is decoded before the
    handler sees it and its answer encoded after (an echo goes back as the request's own bytes); each reply to our
    own request is decoded before ``on_reply`` sees it."""

    def __init__(self, encoding: Encoding, handler: Handler | None, on_reply: ReplyHandler | None) -> None:
        self._encoding, self._handler, self._on_reply = encoding, handler, on_reply
        self._answer = np.empty(encoding.size, encoding.dtype)

    def handle(self, peer: int, payload: np.ndarray, reply_out: np.ndarray) -> None:
        theirs = self._encoding.decode(payload)
        self._handler(peer, theirs, self._answer)
        echo = np.array_equal(self._answer, theirs)
        reply_out[:] = payload if echo else self._encoding.encode(self._answer)

    def take_reply(self, peer: int, payload: np.ndarray) -> None:
        self._on_reply(peer, self._encoding.decode(payload))
