"""Whole-job operations: every rank calls them together. Written once here for the Worker, the strategies and the
adapters (which only turn their tensors into flat arrays and back).

They travel on the engine they are given; the Worker passes its unmetered engine, so start-up broadcasts and
evaluation averages are not counted as training traffic. Every value crosses as raw numbers, never a pickle. Their
model-sized collectives are of kind "job" (``fast_core.engine.base.COLLECTIVE_KINDS``), so one rank averaging the
consensus model can never match another rank's gradient all-reduce of the same size; the small control numbers
(``count_active``, ``min_max``) have no kind.
"""

from __future__ import annotations

import zlib
from collections.abc import MutableMapping, Sequence

import numpy as np

from fast_core.engine import Engine
from fast_core.model.contract import ModelAdapter

JOB = "job"
"""The collective kind of whole-job operations (see COLLECTIVE_KINDS)."""


def broadcast_params(model: ModelAdapter, engine: Engine, root: int = 0) -> None:
    """Overwrite every rank's parameters with ``root``'s."""
    params = np.ascontiguousarray(model.params())
    engine.broadcast(params, root, kind=JOB)
    model.set_params(params)


def average_params(model: ModelAdapter, engine: Engine) -> np.ndarray:
    """The mean of all ranks' parameters (one allreduce), as a new buffer; the model is left as it is."""
    mean = np.array(model.params(), copy=True)
    engine.allreduce(mean, kind=JOB)
    mean /= engine.size
    return mean


def consensus_distance(model: ModelAdapter, engine: Engine) -> float:
    """(1/N) sum_i ||x_i - x_bar||^2, the spread decentralized methods keep small (two allreduces)."""
    mean = average_params(model, engine)
    spread = np.array([np.sum((model.params() - mean) ** 2, dtype=np.float64)])
    engine.allreduce(spread, kind=JOB)
    return float(spread[0]) / engine.size


def restart_from_best(model: ModelAdapter, engine: Engine, metric: float, reset_optimizer: bool = False) -> int:
    """Give every rank the parameters of the rank with the highest ``metric`` (lowest rank on ties); returns it.

    With ``reset_optimizer`` the adapter's ``reset_optimizer()`` also clears optimizer state, as the original FAST
    did.
    """
    best = np.array([metric], dtype=np.float64)
    engine.allreduce(best, op="max", kind=JOB)
    owner = np.array([engine.rank if metric >= best[0] else engine.size], dtype=np.int64)
    engine.allreduce(owner, op="min", kind=JOB)
    broadcast_params(model, engine, root=int(owner[0]))
    if reset_optimizer:
        model.reset_optimizer()
    return int(owner[0])


def count_active(engine: Engine, active: bool) -> int:
    """How many ranks are still active (one 8-byte allreduce): the join protocol of uneven inputs."""
    flag = np.array([1 if active else 0], dtype=np.int64)
    engine.allreduce(flag)
    return int(flag[0])


def min_max(engine: Engine, value: int) -> tuple[int, int]:
    """The smallest and largest ``value`` over ranks (two 8-byte allreduces): equal when all ranks agree."""
    low, high = np.array([value], dtype=np.int64), np.array([value], dtype=np.int64)
    engine.allreduce(low, op="min")
    engine.allreduce(high, op="max")
    return int(low[0]), int(high[0])


def average_arrays(arrays: Sequence[np.ndarray], engine: Engine) -> list[np.ndarray]:
    """The mean over ranks of each array, in one float64 message for all of them (summed in float64, returned in
    each array's own dtype and shape)."""
    return _reduce(arrays, engine, mean=True)


def sum_arrays(arrays: Sequence[np.ndarray], engine: Engine) -> list[np.ndarray]:
    """The sum over ranks of each array, in one float64 message (exact for integers below 2**53), returned in each
    array's own dtype and shape."""
    return _reduce(arrays, engine, mean=False)


def check_same_arrays(arrays: Sequence[np.ndarray], engine: Engine, what: str) -> None:
    """Raise on every rank when the ranks pass arrays of different count, shapes or dtypes to one collective.

    Two 8-byte allreduces: without them ranks sending different lengths would add unrelated numbers or wait for
    each other until the timeout.
    """
    layout = ";".join(f"{np.asarray(a).shape}:{np.asarray(a).dtype}" for a in arrays)
    low, high = min_max(engine, zlib.crc32(layout.encode()))
    if low != high:
        raise ValueError(
            f"rank {engine.rank} passes {what} of {len(arrays)} tensor(s) [{layout[:200]}], and another rank passes "
            "other shapes or dtypes: every rank must call the collective with the same structure"
        )


def _reduce(arrays: Sequence[np.ndarray], engine: Engine, mean: bool) -> list[np.ndarray]:
    if not arrays:
        return []
    total = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays])
    engine.allreduce(total, kind=JOB)
    if mean:
        total /= engine.size
    return _split(total, arrays, cast=True)


def broadcast_arrays(arrays: Sequence[np.ndarray], engine: Engine, root: int = 0) -> list[np.ndarray]:
    """``root``'s values of each array on every rank, as one byte message for all (any dtypes, bit-exact)."""
    if not arrays:
        return []
    contiguous = [np.asarray(a, order="C") for a in arrays]  # ascontiguousarray would make 0-d arrays 1-d
    raw = np.concatenate([a.reshape(-1).view(np.uint8) for a in contiguous])
    engine.broadcast(raw, root, kind=JOB)
    out, offset = [], 0
    for a in contiguous:
        out.append(raw[offset : offset + a.nbytes].view(a.dtype).reshape(a.shape).copy())
        offset += a.nbytes
    return out


def gather_arrays(array: np.ndarray, engine: Engine) -> list[np.ndarray]:
    """Every rank's ``array`` on every rank, in rank order (an allgather), bit-exact in any dtype.

    The arrays may differ in their first dimension (a 0-d array counts as one row); the rest of the shape and the
    dtype must agree, else every rank raises. Two sums, no gather primitive needed: the row counts, then each rank's
    bytes placed in its own slot of a zero buffer (adding zeros leaves bytes unchanged).
    """
    rows = np.asarray(array, order="C")
    rows = rows.reshape(1, *rows.shape) if rows.ndim == 0 else rows
    check_same_arrays([rows[:0]], engine, "allgather()")
    counts = np.zeros(engine.size, dtype=np.int64)
    counts[engine.rank] = rows.shape[0]
    engine.allreduce(counts, kind=JOB)
    row_bytes = rows[:1].nbytes if rows.shape[0] else int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.itemsize
    ends = np.cumsum(counts) * row_bytes
    starts = ends - counts * row_bytes
    raw = np.zeros(int(ends[-1]), dtype=np.uint8)
    raw[starts[engine.rank] : ends[engine.rank]] = rows.reshape(-1).view(np.uint8)
    if raw.size:
        engine.allreduce(raw, kind=JOB)
    return [
        raw[start:end].view(rows.dtype).reshape(int(count), *rows.shape[1:]).copy()
        for start, end, count in zip(starts, ends, counts, strict=True)
    ]


def gather_texts(text: str, engine: Engine) -> list[str]:
    """Every rank's ``text``, in rank order, on every rank (UTF-8 bytes through ``gather_arrays``)."""
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    return [part.tobytes().decode() for part in gather_arrays(raw, engine)]


def average_logs(logs: MutableMapping[str, object], engine: Engine) -> None:
    """Replace every number in ``logs`` by its mean over ranks, in place.

    Ranks must log the same names; a difference raises on every rank instead of averaging unrelated numbers.
    """
    names = sorted(k for k, v in logs.items() if isinstance(v, int | float | np.number) and not isinstance(v, bool))
    low, high = min_max(engine, zlib.crc32("\0".join(names).encode()))
    if low != high:
        raise ValueError(
            f"rank {engine.rank} logs {names}, and another rank logs other names; every rank must log the same "
            "metrics for them to be averaged"
        )
    values = np.array([float(logs[k]) for k in names], dtype=np.float64)
    engine.allreduce(values, kind=JOB)
    values /= engine.size
    for name, value in zip(names, values, strict=True):
        logs[name] = float(value)


def _split(flat: np.ndarray, like: Sequence[np.ndarray], cast: bool) -> list[np.ndarray]:
    out, offset = [], 0
    for a in like:
        a = np.asarray(a)
        piece = flat[offset : offset + a.size].reshape(a.shape)
        out.append(piece.astype(a.dtype) if cast else piece.copy())
        offset += a.size
    return out
