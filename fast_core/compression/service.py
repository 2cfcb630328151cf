"""A RequestService whose requests and replies travel as a codec's bytes: what gives AD-PSGD and asynchronous
EASGD their ``compress=`` option.

The strategy's handlers see decoded values, as with a plain service; ``as_received(values)`` tells a strategy
what its peer reads of a message it sends, so a pair can move by exactly opposite amounts (AD-PSGD keeps the
average of all workers exact under compression this way). A reply equal to the decoded request (an echo: AD-PSGD's
answer to crossed requests) goes back as the request's own bytes, so its sender recognises it whatever the codec.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fast_core.compression.codecs import Codec
from fast_core.engine import Engine
from fast_core.transport.service import Handler, ReplyHandler, RequestService


class CodedService(RequestService):
    """``RequestService`` of ``size`` values of ``dtype`` whose messages are ``codec``'s encoding."""

    def __init__(
        self,
        codec: Codec,
        engine: Engine,
        askers: Sequence[int],
        size: int,
        dtype: np.dtype | str,
        handler: Handler | None,
        **options: object,
    ) -> None:
        """As ``RequestService``; ``options`` are its keywords (``on_reply``, ``name``, ``start``)."""
        on_reply: ReplyHandler | None = options.pop("on_reply", None)
        self.codec = codec
        self.values = size
        self.values_dtype = np.dtype(dtype)
        self._values_handler, self._values_on_reply = handler, on_reply
        self._theirs = np.empty(size, self.values_dtype)  # decoded request and reply of the service thread
        self._answer_values = np.empty(size, self.values_dtype)
        self._asked = np.empty(size, self.values_dtype)  # our last request as the peer decodes it
        coded = len(codec.encode(np.zeros(size, np.float32)))
        super().__init__(
            engine,
            askers,
            coded,
            np.uint8,
            self._coded_handler if handler is not None else None,
            on_reply=self._coded_on_reply if on_reply is not None else None,
            **options,
        )

    def decode(self, payload: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
        """The values of a coded message, into ``into`` (a new array when None)."""
        into = np.empty(self.values, self.values_dtype) if into is None else into
        into[:] = self.codec.decode(payload, self.values)
        return into

    def as_received(self, values: np.ndarray) -> np.ndarray:
        """What a peer reads of ``values`` when this service sends them (a new array)."""
        return self.decode(self.codec.encode(values))

    def ask(self, peer: int, payload: np.ndarray) -> None:
        """Encode ``payload`` and send it to ``peer`` as a request."""
        coded = self.codec.encode(np.asarray(payload).reshape(-1))
        self.decode(coded, self._asked)
        super().ask(peer, coded)

    @property
    def request_payload(self) -> np.ndarray:
        """Our last request as the peer decoded it (unchanged until the next ask)."""
        return self._asked

    def reply(self) -> np.ndarray:
        """The decoded reply to our request (waits as ``RequestService.reply`` does)."""
        return self.decode(super().reply())

    def _coded_handler(self, peer: int, payload: np.ndarray, reply_out: np.ndarray) -> None:
        theirs = self.decode(payload, self._theirs)
        self._values_handler(peer, theirs, self._answer_values)
        echo = np.array_equal(self._answer_values, theirs)
        reply_out[:] = payload if echo else self.codec.encode(self._answer_values)

    def _coded_on_reply(self, peer: int, payload: np.ndarray) -> None:
        self._values_on_reply(peer, self.decode(payload, self._theirs))


def open_service(
    engine: Engine,
    askers: Sequence[int],
    size: int,
    dtype: np.dtype | str,
    handler: Handler | None,
    codec: Codec | None,
    **options: object,
) -> RequestService:
    """A plain RequestService without a codec, else a CodedService."""
    if codec is None:
        return RequestService(engine, askers, size, dtype, handler, **options)
    return CodedService(codec, engine, askers, size, dtype, handler, **options)
