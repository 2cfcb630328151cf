"""Message codecs: a float32 vector to a smaller byte payload and back (issue 15's composable compression pieces).

Each codec is a pure pair ``encode(x, seed) -> uint8 payload`` / ``decode(payload, size, seed) -> float32`` over a
flat vector, NumPy only and vectorised, so any strategy's message can pass through one and the bytes on the wire
are the payload's. The lossy ones are meant to be used with ``ErrorFeedback`` (what a message leaves out is sent
later), as CHOCO-SGD and error-feedback SGD require.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class Codec:
    """A float32 vector <-> bytes; ``seed`` lets sender and receiver agree on random choices without sending them."""

    name = "none"

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        return _f32(x).view(np.uint8).copy()

    def decode(self, payload: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
        return payload.view(np.float32)[:size].copy()

    def ratio(self, size: int) -> float:
        """How many times fewer bytes than float32 a vector of ``size`` takes."""
        return 4.0 * size / len(self.encode(np.zeros(size, np.float32)))

    def __repr__(self) -> str:
        return self.name


class Float16(Codec):
    """IEEE half precision (about 3 decimal digits; overflows above 65504 become inf)."""

    name = "fp16"

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        return _f32(x).astype(np.float16).view(np.uint8)

    def decode(self, payload: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
        return payload.view(np.float16)[:size].astype(np.float32)


class BFloat16(Codec):
    """bfloat16: float32's exponent range, 8 bits of mantissa, rounded to nearest even (NaN stays NaN)."""

    name = "bf16"

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        bits = _f32(x).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        rounded[np.isnan(_f32(x))] = 0x7FC0
        return rounded.view(np.uint8)

    def decode(self, payload: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
        return (payload.view(np.uint16)[:size].astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True, repr=False)
class Int8(Codec):
    """8-bit integers with one float32 scale per ``block`` values (the block's largest magnitude / 127)."""

    block: int = 256
    name = "int8"

    def __post_init__(self) -> None:
        if self.block < 1:
            raise ValueError(f"int8's block must be >= 1 value, got {self.block}")

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        x = _f32(x)
        blocks = np.zeros(math.ceil(len(x) / self.block) * self.block, np.float32)
        blocks[: len(x)] = x
        blocks = blocks.reshape(-1, self.block)
        scales = np.abs(blocks).max(axis=1) / 127.0
        scales[scales == 0] = 1.0
        quantized = np.rint(blocks / scales[:, None]).clip(-127, 127).astype(np.int8)
        values = quantized.reshape(-1)[: len(x)]  # the last block's padding is not sent
        return np.concatenate([scales.astype(np.float32).view(np.uint8), values.view(np.uint8)])

    def decode(self, payload: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
        count = math.ceil(size / self.block)
        scales = payload[: 4 * count].view(np.float32)
        quantized = np.zeros(count * self.block, np.int8)
        quantized[:size] = payload[4 * count : 4 * count + size].view(np.int8)
        return (quantized.reshape(count, self.block) * scales[:, None]).reshape(-1)[:size].astype(np.float32)

    def __repr__(self) -> str:
        return f"int8:block={self.block}"


@dataclass(frozen=True, repr=False)
class TopK(Codec):
    """The ``ratio`` of values with the largest magnitudes, as (int32 index, float32 value) pairs; the rest 0."""

    ratio_kept: float = 0.01
    name = "topk"

    def __post_init__(self) -> None:
        if not 0 < self.ratio_kept <= 1:
            raise ValueError(f"topk's ratio must be in (0, 1], got {self.ratio_kept}")

    def kept(self, size: int) -> int:
        return max(1, math.ceil(self.ratio_kept * size))

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        x = _f32(x)
        k = self.kept(len(x))
        index = np.sort(np.argpartition(np.abs(x), len(x) - k)[len(x) - k :]).astype(np.int32)
        return np.concatenate([index.view(np.uint8), x[index].view(np.uint8)])

    def decode(self, payload: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
        k = self.kept(size)
        out = np.zeros(size, np.float32)
        out[payload[: 4 * k].view(np.int32)] = payload[4 * k :].view(np.float32)
        return out

    def __repr__(self) -> str:
        return f"topk:ratio={self.ratio_kept:g}"


@dataclass(frozen=True, repr=False)
class RandomK(TopK):
    """The ``ratio`` of values at positions drawn from ``seed`` (sender and receiver draw the same): only the
    float32 values travel."""

    name = "randomk"

    def positions(self, size: int, seed: int) -> np.ndarray:
        return np.sort(np.random.default_rng(seed).choice(size, self.kept(size), replace=False))

    def encode(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        return _f32(x)[self.positions(len(x), seed)].view(np.uint8)

    def decode(self, payload: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
        out = np.zeros(size, np.float32)
        out[self.positions(size, seed)] = payload.view(np.float32)
        return out

    def __repr__(self) -> str:
        return f"randomk:ratio={self.ratio_kept:g}"


def _f32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"codecs take a flat vector, got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)
