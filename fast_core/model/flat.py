"""One contiguous buffer for all parameters: the unit every strategy and engine works on.

A model's parameters are described by a FlatLayout (names, shapes, dtypes and offsets); strategies then mix one
NumPy vector instead of looping over tensors, and engines send it as one message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from fast_core.errors import ModelMismatchError


@dataclass(frozen=True)
class FlatEntry:
    """Where one named parameter lives inside the flat buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    size: int


class FlatLayout:
    """Names, shapes, dtypes and offsets of parameters packed into one contiguous 1-D buffer.

    All parameters share the buffer's dtype: a model mixing float32 and float64 must choose one
    (pass ``dtype=``) because strategies average the whole buffer at once.
    """

    def __init__(self, specs: Iterable[tuple[str, tuple[int, ...], np.dtype | str]], dtype: str | None = None):
        entries: list[FlatEntry] = []
        offset = 0
        dtypes = set()
        for name, shape, entry_dtype in specs:
            shape = tuple(int(s) for s in shape)
            size = int(np.prod(shape, dtype=np.int64))
            entry_dtype = np.dtype(entry_dtype).name
            dtypes.add(entry_dtype)
            entries.append(FlatEntry(str(name), shape, entry_dtype, offset, size))
            offset += size
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"parameter names must be unique; repeated: {dup}")
        if dtype is None:
            if len(dtypes) > 1:
                raise TypeError(
                    f"parameters have several dtypes {sorted(dtypes)}; FAST keeps all parameters in one buffer, "
                    "so convert the model to one dtype or pass dtype= to choose the buffer's dtype"
                )
            dtype = dtypes.pop() if dtypes else "float32"
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise TypeError(f"the flat buffer must have a floating dtype, got {self.dtype}")
        self.entries: tuple[FlatEntry, ...] = tuple(entries)
        self.size = offset

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], dtype: str | None = None) -> FlatLayout:
        """Layout for named arrays, in the mapping's order."""
        return cls(((n, np.shape(a), np.asarray(a).dtype) for n, a in arrays.items()), dtype=dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def empty(self) -> np.ndarray:
        """A new, uninitialised flat buffer of this layout."""
        return np.empty(self.size, dtype=self.dtype)

    def pack(self, arrays: Mapping[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Copy named arrays into one flat buffer (``out`` is reused when given)."""
        out = self.empty() if out is None else out
        self._check_buffer(out)
        for e in self.entries:
            if e.name not in arrays:
                raise KeyError(f"parameter '{e.name}' of the layout is missing from the arrays to pack")
            value = np.asarray(arrays[e.name])
            if value.shape != e.shape:
                raise ValueError(f"parameter '{e.name}' has shape {value.shape}, the layout expects {e.shape}")
            out[e.offset : e.offset + e.size] = value.reshape(-1)
        return out

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Views (no copies) of each parameter inside ``flat``."""
        self._check_buffer(flat)
        return {e.name: flat[e.offset : e.offset + e.size].reshape(e.shape) for e in self.entries}

    def _check_buffer(self, flat: np.ndarray) -> None:
        if flat.ndim != 1 or flat.size != self.size:
            raise ValueError(f"flat buffer has shape {flat.shape}, the layout needs ({self.size},)")
        if flat.dtype != self.dtype:
            raise TypeError(f"flat buffer has dtype {flat.dtype}, the layout needs {self.dtype}")

    def describe(self) -> str:
        """A canonical JSON text of the layout: what ranks compare to prove they train the same model."""
        return json.dumps(
            {"dtype": self.dtype.name, "entries": [[e.name, list(e.shape), e.dtype] for e in self.entries]},
            separators=(",", ":"),
        )

    def fingerprint(self) -> bytes:
        """32-byte SHA-256 digest of :meth:`describe`; equal on every rank iff the models have the same layout."""
        return hashlib.sha256(self.describe().encode()).digest()

    def first_difference(self, other_description: str) -> str | None:
        """Human-readable first difference between this layout and another rank's :meth:`describe` text."""
        other = json.loads(other_description)
        mine = json.loads(self.describe())
        if mine["dtype"] != other["dtype"]:
            return f"buffer dtype {mine['dtype']} vs {other['dtype']}"
        for index, (a, b) in enumerate(zip(mine["entries"], other["entries"], strict=False)):
            if a != b:
                return f"parameter #{index}: {_entry_text(a)} vs {_entry_text(b)}"
        if len(mine["entries"]) != len(other["entries"]):
            n = min(len(mine["entries"]), len(other["entries"]))
            longer = mine["entries"] if len(mine["entries"]) > n else other["entries"]
            return f"parameter #{n}: {_entry_text(longer[n])} exists on one rank only"
        return None

    def __repr__(self) -> str:
        return f"FlatLayout({len(self.entries)} parameters, {self.size} values, {self.dtype})"


def _entry_text(entry: list) -> str:
    name, shape, dtype = entry
    return f"'{name}' shape={tuple(shape)} dtype={dtype}"


def check_same_layout(layout: FlatLayout, engine) -> None:
    """Raise ModelMismatchError on every rank when any rank's layout differs from rank 0's.

    Costs two small allreduces when all agree; on a mismatch the first differing rank's description is broadcast
    so every rank raises the same message naming the first differing parameter.
    """
    digest = np.frombuffer(layout.fingerprint(), dtype=np.uint8).astype(np.int64)
    low, high = digest.copy(), digest.copy()
    engine.allreduce(low, op="min")
    engine.allreduce(high, op="max")
    if np.array_equal(low, high):
        return
    diff = layout.first_difference(engine.broadcast_text(layout.describe(), root=0))
    culprit = np.array([engine.rank if diff is not None else engine.size], dtype=np.int64)
    engine.allreduce(culprit, op="min")
    bad_rank = int(culprit[0])
    message = np.zeros(512, dtype=np.uint8)
    if engine.rank == bad_rank:
        raw = diff.encode()[:512]
        message[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    engine.broadcast(message, root=bad_rank)
    detail = message.tobytes().rstrip(b"\0").decode(errors="replace")
    raise ModelMismatchError(
        f"rank {bad_rank} holds a different model than rank 0 (rank {bad_rank} vs rank 0: {detail}); "
        "every rank must build the same model before FAST starts"
    )
