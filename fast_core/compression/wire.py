"""A strategy's parameter messages through a codec: the one piece that gives D-PSGD, synchronous gossip and
synchronous EASGD their ``compress=`` option (CHOCO-SGD, which sends differences, uses the codecs directly).

A parameter message is the whole vector, so only the dense codecs fit it: top-k or random-k would send zeros in
place of parameters and pull every model toward 0 (``parameter_codec`` refuses them and names CHOCO instead).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..engine import Engine, Request
from .codecs import Codec, RandomK, TopK
from .registry import make_codec


def parameter_codec(compress: str | None, who: str) -> Codec | None:
    """The codec of ``who``'s parameter messages from its ``compress`` option; None for "none" (sent as they are)."""
    if compress is None or str(compress) == "none":
        return None
    codec = make_codec(str(compress))
    if isinstance(codec, TopK | RandomK):
        raise ValueError(
            f"{who} cannot send its vectors as {compress}: a sparsified parameter vector is mostly zeros (and a sum "
            "of sparse gradients is dense); use compress=fp16, bf16 or int8, or choco:...,compress=topk (CHOCO-SGD "
            "sends compressed differences)"
        )
    return codec


class ParameterWire:
    """Exchanges of float parameter buffers, encoded on the way out and decoded into the receive buffers on
    ``finish`` (after the requests completed). Without a codec both are the engine's own exchange."""

    def __init__(self, codec: Codec | None) -> None:
        self.codec = codec
        self._landing: dict[int, np.ndarray] = {}  # one payload buffer per source: every payload has one length
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    def exchange(
        self,
        engine: Engine,
        send: np.ndarray,
        dests: Sequence[int],
        recvs: Sequence[np.ndarray],
        sources: Sequence[int],
        tag: int,
    ) -> list[Request]:
        """Post the exchange; ``send`` is encoded now (it may be reused at once), ``recvs`` are filled by ``finish``."""
        if self.codec is None:
            return engine.exchange(send, dests, recvs, sources, tag)
        payload = self.codec.encode(send if dests else np.zeros(len(send), send.dtype))  # length, not content
        landing = [self._landing.setdefault(peer, np.empty_like(payload)) for peer in sources]
        self._pending = list(zip(landing, recvs, strict=True))
        return engine.exchange(payload, dests, landing, sources, tag)

    def finish(self) -> None:
        """Decode what arrived into the receive buffers of the last exchange (its requests are complete)."""
        for payload, into in self._pending:
            into[:] = self.codec.decode(payload, len(into))
        self._pending = []

    def exchange_and_wait(
        self,
        engine: Engine,
        send: np.ndarray,
        dests: Sequence[int],
        recvs: Sequence[np.ndarray],
        sources: Sequence[int],
        tag: int,
    ) -> None:
        """A blocking exchange: posted, awaited (with the engine's timeout naming the peers), decoded."""
        engine.wait_all(self.exchange(engine, send, dests, recvs, sources, tag))
        self.finish()
