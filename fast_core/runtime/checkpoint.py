"""Checkpoints of a whole job that resume on any number of ranks, written so a crash never leaves a torn file.

``save(path, worker, state)`` is collective: it averages every rank's flat parameters (the consensus model) and
the adapter's extra arrays (optimizer state such as momentum buffers, averaged the same way), and rank 0 writes
one NumPy ``.npz`` file: ``params``, ``state/<i>`` and ``fast.json`` (the step, the strategy, the layout, the
budget spent, the ranks it was saved from). It writes to a temporary file in the same folder, fsyncs it, then
renames it over ``path`` (``os.replace``), so ``path`` always holds the previous complete checkpoint or the new one.
Nothing is unpickled when reading (``allow_pickle=False``; the header is JSON).

``load(path, worker)`` is collective too, on any number of ranks: rank 0 reads and checks the file and broadcasts
it; every rank sets the parameters, the worker's step, and under a sample budget the samples the job has left
(``Worker.resume``, which also tells the strategy that the parameters were replaced). A missing, corrupt or
foreign file is decided on rank 0 and broadcast as a status, so every rank raises the same one-line
``CheckpointError`` and none waits for the others.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fast_core.engine import collectives
from fast_core.errors import FastError
from fast_core.strategies.integrity import all_finite, finite_average

if TYPE_CHECKING:
    from fast_core.engine import Engine
    from fast_core.runtime.worker import Worker

FORMAT = "fast-checkpoint/1"
_HEADER = "fast.json"


class CheckpointError(FastError):
    """A checkpoint could not be written or read (missing, corrupt, another model); raised on every rank."""


@dataclass
class Checkpoint:
    """What ``load`` gives back: the consensus parameters, the adapter's named arrays, and FAST's header."""

    params: np.ndarray
    state: dict[str, np.ndarray] = field(default_factory=dict)
    header: dict = field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.header["step"])

    @property
    def extra(self) -> dict:
        """The adapter's own JSON (e.g. an optimizer's hyper-parameters), as saved by rank 0."""
        return dict(self.header.get("extra", {}))


def save(
    path: str | os.PathLike,
    worker: Worker,
    state: Mapping[str, np.ndarray] | None = None,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Collective: write the job's consensus model, the ranks' average of ``state`` and FAST's state to ``path``.

    ``state``: named arrays with the same names, shapes and dtypes on every rank (else every rank raises).
    ``extra``: JSON-able values of the adapter, rank 0's are kept. Returns once rank 0's file is in place."""
    engine = worker.engine
    state = {str(k): np.asarray(v) for k, v in (state or {}).items()}
    _same_everywhere(engine, _describe(state), "optimizer state (names, shapes or dtypes)")
    params = finite_average(worker.model, engine, "the model to checkpoint")  # a NaN model is never saved
    averaged = dict(zip(state, collectives.average_arrays(list(state.values()), engine), strict=True))
    counts = np.array([worker.metrics.samples], dtype=np.int64)
    engine.allreduce(counts)
    step = np.array([worker.step], dtype=np.int64)
    engine.broadcast(step, root=0)
    spent = worker.claims.samples_before + int(counts[0])
    budget = worker.claims.budget
    header = {
        "format": FORMAT,
        "step": int(step[0]),
        "strategy": repr(worker.strategy),
        "ranks": engine.size,
        "layout": worker.model.layout.describe(),
        "samples_spent": spent,
        "samples_left": None if budget is None or budget.samples is None else max(0, budget.samples - spent),
        "state": [[name, list(a.shape), a.dtype.str] for name, a in averaged.items()],
        "extra": dict(extra or {}),
    }
    error = None
    if engine.rank == 0:
        try:
            _write(os.fspath(path), params, averaged, header)
        except (OSError, TypeError, ValueError) as exc:  # TypeError/ValueError: extra is not JSON-able
            error = f"could not write checkpoint {os.fspath(path)!r}: {exc}"
    _agree(engine, error)


def load(path: str | os.PathLike, worker: Worker) -> Checkpoint:
    """Collective, on any number of ranks: read ``path`` on rank 0, give every rank its parameters, step and budget
    left (``Worker.resume``), and return the checkpoint (its ``state`` arrays for the adapter to set)."""
    engine = worker.engine
    worker.start()  # the strategy is set up first, so resume() re-posts over what setup sent
    header, params, state, error = None, None, {}, None
    if engine.rank == 0:
        try:
            header, params, state = _read(os.fspath(path), worker.model.layout)
        except CheckpointError as exc:
            error = str(exc)
    _agree(engine, error)
    text = engine.broadcast_text(json.dumps(header) if engine.rank == 0 else "")
    header = json.loads(text)
    if engine.rank != 0:
        params = worker.model.layout.empty()
        state = {name: np.empty(shape, dtype=np.dtype(dtype)) for name, shape, dtype in header["state"]}
    arrays = collectives.broadcast_arrays([params, *state.values()], engine, root=0)
    params, state = arrays[0], dict(zip(state, arrays[1:], strict=True))
    worker.model.set_params(params)
    worker.resume(int(header["step"]), int(header["samples_spent"]))
    return Checkpoint(params, state, header)


# writing and reading (rank 0) ------------------------------------------------------------------------------------
def _write(path: str, params: np.ndarray, state: Mapping[str, np.ndarray], header: dict) -> None:
    members = {"params": params, _HEADER: np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
    members.update({f"state/{i}": a for i, a in enumerate(state.values())})
    folder = os.path.dirname(os.path.abspath(path))
    prefix = f".{os.path.basename(path)}.ckpt-"  # the target's own: only its writer (rank 0 of one job) makes these
    for stale in glob.glob(os.path.join(glob.escape(folder), glob.escape(prefix) + "*.tmp")):
        with contextlib.suppress(OSError):  # a save killed mid-write (kill -9) left it: it is never read
            os.unlink(stale)
    handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **members)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)  # atomic: the old checkpoint until here, the new one after
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    try:  # the rename itself survives a power cut once the folder is synced (POSIX; not possible everywhere)
        directory = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass
    finally:
        os.close(directory)


def _read(path: str, layout) -> tuple[dict, np.ndarray, dict[str, np.ndarray]]:
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path!r}: give the path save_checkpoint wrote")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path!r} is not a FAST checkpoint (not the .npz archive save_checkpoint writes: torn, or another kind "
            "of file)"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(bytes(data[_HEADER]).decode())
            if header.get("format") != FORMAT:
                raise ValueError(f"format {header.get('format')!r}, expected {FORMAT!r}")
            params = data["params"]
            state = {name: data[f"state/{i}"] for i, (name, _, _) in enumerate(header["state"])}
            header["step"], header["samples_spent"] = int(header["step"]), int(header["samples_spent"])
    except CheckpointError:
        raise
    except Exception as exc:  # zip, JSON, key or pickle errors alike: the file is not a complete checkpoint
        # NumPy's own text about pickles would invite allow_pickle=True: a FAST checkpoint never holds any
        reason = "it holds pickled objects, which a FAST checkpoint never does" if "pickle" in str(exc) else exc
        raise CheckpointError(f"checkpoint {path!r} is corrupt or not a FAST checkpoint ({reason})") from None
    if header["layout"] != layout.describe():
        difference = layout.first_difference(header["layout"]) or "another layout"
        raise CheckpointError(
            f"checkpoint {path!r} holds another model (this model vs the checkpoint's: {difference}); load it into "
            "the model it was saved from"
        )
    if params.shape != (layout.size,) or params.dtype != layout.dtype:
        raise CheckpointError(f"checkpoint {path!r} is corrupt: its parameters are {params.dtype}{params.shape}")
    if not all_finite(params):  # FAST never writes one: edited or written by something else
        raise CheckpointError(f"checkpoint {path!r} holds NaN or Inf parameters: it is not loaded")
    return header, params, state


# agreement between ranks -----------------------------------------------------------------------------------------
def _agree(engine: Engine, error: str | None, root: int = 0) -> None:
    """Broadcast ``root``'s outcome; every rank raises CheckpointError with root's message when it failed."""
    text = engine.broadcast_text(error or "", root)
    if text:
        raise CheckpointError(text)


def _describe(state: Mapping[str, np.ndarray]) -> str:
    return json.dumps([[name, list(a.shape), a.dtype.str] for name, a in state.items()])


def _same_everywhere(engine: Engine, description: str, what: str) -> None:
    low, high = collectives.min_max(engine, zlib.crc32(description.encode()))
    if low != high:
        raise CheckpointError(
            f"rank {engine.rank}: the ranks hold different {what}; every rank must have taken a step with the same "
            "optimizer before save_checkpoint"
        )
