"""A Mailbox whose messages travel as a codec's bytes: the one piece that gives the asynchronous strategies
(asynchronous averaging, asynchronous FAST) their ``compress=`` option.

The trainer posts and takes float vectors as with a plain Mailbox; the slots on the wire hold the 16-byte header
of ``framing`` and the codec's payload. The sender encodes once per post (one payload for every out-neighbour,
through its error-feedback residual when ``feedback=True``); the receiver decodes a message once, seeded by the
sender's rank and the step in its header, so random-k needs no positions on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fast_core.compression.codecs import Codec
from fast_core.compression.feedback import ErrorFeedback
from fast_core.compression.wire import message_seed
from fast_core.engine import Engine
from fast_core.transport.mailbox import Mailbox, Message


class CodedMailbox(Mailbox):
    """``Mailbox`` of ``size`` values of ``dtype`` that sends ``codec``'s encoding of each post."""

    def __init__(
        self,
        engine: Engine,
        sources: Sequence[int],
        dests: Sequence[int],
        size: int,
        dtype: np.dtype | str,
        codec: Codec,
        *,
        feedback: bool = False,
        **options: object,
    ) -> None:
        self.codec = codec
        self.values_dtype = np.dtype(dtype)
        self._values = size
        self._coder: Codec | ErrorFeedback = ErrorFeedback(codec, size) if feedback else codec
        self._decoded: dict[int, tuple[int, np.ndarray]] = {}  # per peer: (sequence, values) of its newest take
        coded = len(codec.encode(np.zeros(size, np.float32)))
        super().__init__(engine, sources, dests, coded, np.uint8, **options)

    def post(self, payload: np.ndarray, step: int) -> None:
        """Encode ``payload`` (``size`` values) and stage its bytes as this rank's newest message."""
        flat = np.asarray(payload).reshape(-1)
        if len(flat) != self._values:
            raise ValueError(f"{self.name}: payload of {len(flat)} values, expected {self._values}")
        super().post(self._coder.encode(flat, message_seed(step, self.rank, self.engine.size)), step)

    def take(self, peer: int) -> Message | None:
        """As ``Mailbox.take``, with the payload decoded (once per message; valid until the next take of ``peer``)."""
        message = super().take(peer)
        if message is None:
            return None
        sequence, values = self._decoded.get(peer, (0, None))
        if sequence != message.sequence or values is None:
            values = self._decode(peer, message)
            self._decoded[peer] = (message.sequence, values)
        return Message(values, message.step, message.sequence, message.fresh)

    def take_all(self, peer: int) -> list[Message]:
        """As ``Mailbox.take_all``, each payload decoded into its own array."""
        return [Message(self._decode(peer, m), m.step, m.sequence, m.fresh) for m in super().take_all(peer)]

    def _decode(self, peer: int, message: Message) -> np.ndarray:
        values = self.codec.decode(message.payload, self._values, message_seed(message.step, peer, self.engine.size))
        return values.astype(self.values_dtype)


def open_mailbox(
    engine: Engine,
    sources: Sequence[int],
    dests: Sequence[int],
    size: int,
    dtype: np.dtype | str,
    codec: Codec | None,
    **options: object,
) -> Mailbox:
    """A plain Mailbox without a codec, else a CodedMailbox (``feedback=`` among ``options`` goes to it)."""
    if codec is None:
        options.pop("feedback", None)
        return Mailbox(engine, sources, dests, size, dtype, **options)
    return CodedMailbox(engine, sources, dests, size, dtype, codec, **options)
