"""The one message format of the communication threads: a 16-byte header (int64 step, int64 sequence number)
then the payload bytes, all in one flat uint8 slot, so a message is a single send and nothing is pickled.

A slot is written with one copy of the payload (``write``) and read without any (``read`` returns a view).
"""

from __future__ import annotations

import numpy as np

HEADER_BYTES = 16
"""Bytes before the payload: the sender's step and its message sequence number, both int64."""

NO_MESSAGE = (-1, 0)
"""(step, sequence) of "nothing arrived yet": real sequence numbers start at 1."""


def allocate(payload_bytes: int) -> np.ndarray:
    """A zeroed slot for a payload of ``payload_bytes`` (a zero sequence number reads as no message)."""
    return np.zeros(HEADER_BYTES + payload_bytes, dtype=np.uint8)


def write(slot: np.ndarray, payload: np.ndarray, step: int, sequence: int) -> None:
    """Copy ``payload`` (any shape, contiguous or not) and its header into ``slot``: the one copy of a send."""
    slot[:HEADER_BYTES].view(np.int64)[:] = (step, sequence)
    slot[HEADER_BYTES:] = np.ascontiguousarray(payload).reshape(-1).view(np.uint8)


def header(slot: np.ndarray | None) -> tuple[int, int]:
    """(step, sequence) of the message in ``slot``; ``NO_MESSAGE`` for no slot."""
    if slot is None:
        return NO_MESSAGE
    step, sequence = slot[:HEADER_BYTES].view(np.int64)
    return int(step), int(sequence)


def payload(slot: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The payload of ``slot`` as a flat ``dtype`` array: a view, valid as long as the slot is not rewritten."""
    return slot[HEADER_BYTES:].view(dtype)


def read(slot: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, int, int]:
    """(payload view, step, sequence) of the message in ``slot``."""
    return (payload(slot, dtype), *header(slot))
