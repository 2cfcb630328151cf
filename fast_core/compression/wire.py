"""How values travel as a codec's bytes: the one wire format of every message that can be compressed.

Every transport takes a codec the same way, one ``codec`` argument (None: the values as they are), and gets from
here how its payload is made: ``encoding_for`` gives the ``Encoding`` of a vector (its payload's size, ``encode``,
``decode``), which the communication threads (``fast_core.transport``: mailbox, request service, gossip boxes) put
into their slots, and ``ParameterWire`` uses for the synchronous exchanges of D-PSGD, synchronous gossip,
synchronous EASGD, synchronous FAST and SGP (CHOCO-SGD, which sends differences, uses the codecs directly).

A parameter message is the whole vector, so only the dense codecs fit it: top-k or random-k would send zeros in
place of parameters and pull every model toward 0 (``parameter_codec`` refuses them and names CHOCO instead).
Gradients may take any codec (``gradient_codec``) when they travel with error feedback (``feedback=True``): what
one message leaves out is added to the sender's next one. A message of step s from rank r is seeded by
``message_seed(s, r, size)``, which both ends know, so random-k needs no positions on the wire.

Compression sits below the transports: a codec is a pure function of arrays and knows nothing of messages, so the
transports import this module and never the other way round.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

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


class Encoding(ABC):
    """How ``size`` values of ``dtype`` travel in a message: the payload's element type and length, and the two
    directions. The trainer's end ``encode``s (once per message, whatever the number of receivers); the other end
    ``decode``s with the same seed."""

    def __init__(self, size: int, dtype: DTypeLike, payload_dtype: DTypeLike, payload_length: int) -> None:
        self.size = size
        self.dtype = np.dtype(dtype)
        self.payload_dtype = np.dtype(payload_dtype)
        """The element type of the payload (the values' own, or uint8 for a codec's bytes)."""
        self.payload_length = payload_length
        """Elements of ``payload_dtype`` in one payload."""

    @property
    def payload_bytes(self) -> int:
        return self.payload_length * self.payload_dtype.itemsize

    @abstractmethod
    def flat(self, values: np.ndarray, who: str) -> np.ndarray:
        """``values`` as the flat vector this encoding sends, or ValueError naming ``who`` when they do not fit."""

    @abstractmethod
    def encode(self, values: np.ndarray, seed: int = 0) -> np.ndarray:
        """The payload of a flat vector (plain: the vector itself, no copy)."""

    @abstractmethod
    def decode(self, payload: np.ndarray, seed: int = 0) -> np.ndarray:
        """The values of a payload read as ``payload_dtype`` (plain: the payload itself, no copy)."""

    @abstractmethod
    def as_received(self, values: np.ndarray) -> np.ndarray:
        """What the other end reads of ``values`` (plain: ``values``; a codec: what it leaves of them)."""


class PlainEncoding(Encoding):
    """The values as they are: the payload is their bytes."""

    def __init__(self, size: int, dtype: DTypeLike) -> None:
        super().__init__(size, dtype, dtype, size)

    def flat(self, values: np.ndarray, who: str) -> np.ndarray:
        flat = np.ascontiguousarray(values).reshape(-1)
        if flat.nbytes != self.payload_bytes or flat.dtype != self.dtype:
            raise ValueError(
                f"{who}: payload of {flat.nbytes} bytes of {flat.dtype}, expected {self.payload_bytes} bytes of "
                f"{self.dtype}"
            )
        return flat

    def encode(self, values: np.ndarray, seed: int = 0) -> np.ndarray:
        return np.ascontiguousarray(values).reshape(-1)

    def decode(self, payload: np.ndarray, seed: int = 0) -> np.ndarray:
        return payload

    def as_received(self, values: np.ndarray) -> np.ndarray:
        return values


class CodedEncoding(Encoding):
    """The values as ``codec``'s bytes, through an error-feedback residual with ``feedback=True``; decoded values
    are a new array of ``dtype``."""

    def __init__(self, codec: Codec, size: int, dtype: DTypeLike, feedback: bool = False) -> None:
        super().__init__(size, dtype, np.uint8, len(codec.encode(np.zeros(size, np.float32))))
        self.codec = codec
        self._coder: Codec | ErrorFeedback = ErrorFeedback(codec, size) if feedback else codec

    def flat(self, values: np.ndarray, who: str) -> np.ndarray:
        flat = np.asarray(values).reshape(-1)
        if len(flat) != self.size:
            raise ValueError(f"{who}: payload of {len(flat)} values, expected {self.size}")
        return flat

    def encode(self, values: np.ndarray, seed: int = 0) -> np.ndarray:
        return self._coder.encode(np.asarray(values).reshape(-1), seed)

    def decode(self, payload: np.ndarray, seed: int = 0) -> np.ndarray:
        return self.codec.decode(payload, self.size, seed).astype(self.dtype)

    def as_received(self, values: np.ndarray) -> np.ndarray:
        return self.decode(self.codec.encode(np.asarray(values).reshape(-1)))


def encoding_for(codec: Codec | None, size: int, dtype: DTypeLike, feedback: bool = False) -> Encoding:
    """The encoding of ``size`` values of ``dtype`` under ``codec`` (None: plain; ``feedback``: error feedback)."""
    if codec is None:
        return PlainEncoding(size, dtype)
    return CodedEncoding(codec, size, dtype, feedback)


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
        self._head: CodedEncoding | None = None  # the values before the exact tail, made at the first exchange
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
        if self._head is None:
            self._head = CodedEncoding(self.codec, tail, send.dtype, self.feedback)
        self._step, self._size = step, engine.size
        if dests:
            coded = self._head.encode(send[:tail], message_seed(step, engine.rank, engine.size))
        else:  # nothing to send: only the length matters, and no residual may change
            coded = np.zeros(self._head.payload_length, np.uint8)
        payload = np.concatenate([coded, np.ascontiguousarray(send[tail:]).view(np.uint8)])
        landing = [self._landing.setdefault(peer, np.empty_like(payload)) for peer in sources]
        self._pending = list(zip(sources, landing, recvs, strict=True))
        return engine.exchange(payload, dests, landing, sources, tag)

    def finish(self) -> None:
        """Decode what arrived into the receive buffers of the last exchange (its requests are complete)."""
        for peer, payload, into in self._pending:
            tail = len(into) - self.exact_tail
            coded = len(payload) - self.exact_tail * into.itemsize
            into[:tail] = self._head.decode(payload[:coded], message_seed(self._step, peer, self._size))
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
