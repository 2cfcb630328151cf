"""Error feedback: what a lossy codec leaves out of one message is added to the next, so nothing is lost for good.

``e <- x + e - decode(encode(x + e))``: over T messages the decoded values sum to the inputs' sum minus the last
residual, which stays bounded; this is what makes top-k and int8 messages converge (Karimireddy et al. 2019,
CHOCO-SGD's compressed differences).
"""

from __future__ import annotations

import numpy as np

from fast_core.compression.codecs import Codec


class ErrorFeedback:
    """``codec`` with a residual of ``size`` float32 values carried from message to message."""

    def __init__(self, codec: Codec, size: int) -> None:
        self.codec = codec
        self.residual = np.zeros(size, np.float32)
        self.bytes_sent = 0

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        """The payload for ``x`` plus what earlier messages left out; the residual keeps what this one leaves."""
        corrected = np.asarray(x, dtype=np.float32) + self.residual
        payload = self.codec.encode(corrected, seed)
        self.residual = corrected - self.codec.decode(payload, len(corrected), seed)
        self.bytes_sent += payload.nbytes
        return payload
