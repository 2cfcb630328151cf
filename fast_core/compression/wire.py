"""A strategy's messages through a codec: the one piece that gives D-PSGD, synchronous gossip, synchronous EASGD,
synchronous FAST and SGP their ``compress=`` option (CHOCO-SGD, which sends differences, uses the codecs directly;
the asynchronous strategies' mailboxes use ``coded_mailbox``).

A parameter message is the whole vector, so only the dense codecs fit it: top-k or random-k would send zeros in
place of parameters and pull every model toward 0 (``parameter_codec`` refuses them and names CHOCO instead).
Gradients may take any codec (``gradient_codec``) when they travel with error feedback (``feedback=True``): what
one message leaves out is added to the sender's next one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fast_core.compression.codecs import Codec, RandomK, TopK
from fast_core.compression.feedback import ErrorFeedback
from fast_core.compression.registry import make_codec
from fast_core.engine import Engine, Request


def parameter_codec(compress: str | None, who: str) -> Codec | None:
    """The codec of ``who``'s parameter messages from its ``compress`` option; None for "none" (sent as they are)."""
    codec = gradient_codec(compress)
    if isinstance(codec, TopK | RandomK):
        raise ValueError(
            f"{who} cannot send its vectors as {compress}: a sparsified parameter vector is mostly zeros (and a sum "
            "of sparse gradients is dense); use compress=fp16, bf16 or int8, or choco:...,compress=topk (CHOCO-SGD "
            "sends compressed differences)"
        )
    return codec


def gradient_codec(compress: str | None) -> Codec | None:
    """Any codec from a ``compress`` option (sent with error feedback); None for "none"."""
    if compress is None or str(compress) == "none":
        return None
    return make_codec(str(compress))


def message_seed(step: int, sender: int, size: int) -> int:
    """The seed of ``sender``'s message of ``step``: what random-k draws its positions from, known to both ends
    (the receiver reads the step from the message or knows it), different for every sender and step."""
    return step * size + sender


class ParameterWire:
    """Exchanges of float buffers, encoded on the way out and decoded into the receive buffers on ``finish``
    (after the requests completed). Without a codec both are the engine's own exchange.

    ``feedback=True`` keeps the sender's error-feedback residual (``ErrorFeedback``), for the sparsifying codecs.
    ``exact_tail`` values at the end of every buffer travel as they are (SGP's push-sum weight must not be rounded).
    """

    def __init__(self, codec: Codec | None, feedback: bool = False, exact_tail: int = 0) -> None:
        self.codec = codec
        self.feedback = feedback
        self.exact_tail = exact_tail
        self._coder: Codec | ErrorFeedback | None = None
        self._landing: dict[int, np.ndarray] = {}  # one payload buffer per source: every payload has one length
        self._pending: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._step = self._size = 0

    def exchange(
        self,
        engine: Engine,
        send: np.ndarray,
        dests: Sequence[int],
        recvs: Sequence[np.ndarray],
        sources: Sequence[int],
        tag: int,
        step: int = 0,
    ) -> list[Request]:
        """Post the exchange; ``send`` is encoded now (it may be reused at once), ``recvs`` are filled by ``finish``.
        ``step`` seeds random-k (every rank of the exchange must give the same)."""
        if self.codec is None:
            return engine.exchange(send, dests, recvs, sources, tag)
        tail = len(send) - self.exact_tail
        if self._coder is None:
            self._coder = ErrorFeedback(self.codec, tail) if self.feedback else self.codec
        self._step, self._size = step, engine.size
        if dests:
            coded = self._coder.encode(send[:tail], message_seed(step, engine.rank, engine.size))
        else:  # nothing to send: only the length matters, and no residual may change
            coded = self.codec.encode(np.zeros(tail, np.float32))
        payload = np.concatenate([coded, np.ascontiguousarray(send[tail:]).view(np.uint8)])
        landing = [self._landing.setdefault(peer, np.empty_like(payload)) for peer in sources]
        self._pending = list(zip(sources, landing, recvs, strict=True))
        return engine.exchange(payload, dests, landing, sources, tag)

    def finish(self) -> None:
        """Decode what arrived into the receive buffers of the last exchange (its requests are complete)."""
        for peer, payload, into in self._pending:
            tail = len(into) - self.exact_tail
            coded = len(payload) - self.exact_tail * into.itemsize
            seed = message_seed(self._step, peer, self._size)
            into[:tail] = self.codec.decode(payload[:coded], tail, seed)
            into[tail:] = payload[coded:].view(into.dtype)
        self._pending = []

    def exchange_and_wait(
        self,
        engine: Engine,
        send: np.ndarray,
        dests: Sequence[int],
        recvs: Sequence[np.ndarray],
        sources: Sequence[int],
        tag: int,
        step: int = 0,
    ) -> None:
        """A blocking exchange: posted, awaited (with the engine's timeout naming the peers), decoded."""
        engine.wait_all(self.exchange(engine, send, dests, recvs, sources, tag, step))
        self.finish()
