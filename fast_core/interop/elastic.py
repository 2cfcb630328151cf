"""Horovod's elastic training (``hvd.elastic``) on FAST's fault tolerance, written once for every adapter: the run
loop, ``State`` and ``ObjectState`` (commit, restore and sync of plain values and of NumPy arrays). An adapter only
says how its model and optimizer become named NumPy arrays and back (a ``Part``): ``fast_torch.horovod.elastic.
TorchState``, ``fast_tf.horovod.elastic.TensorFlowKerasState``.

Under ``fast run --fault-tolerant`` (Open MPI with ULFM) a lost rank reaches every survivor as ``PeerLost`` from
the collective it was in: Horovod's ``HorovodInternalError``. ``run`` then does what Horovod does:

1. the group re-forms over the survivors by FAST's one recovery path (``fast_core.runtime.survival``): through the
   Worker of the script's Horovod optimizer when there is one (its strategy stops and sets up again over the
   survivors; during a run a loss in the optimizer's step is left to this loop, ``Group.defer_losses``), else by
   the engine's shrink; with ``--max-restarts`` new processes take the lost ranks' places;
2. every survivor restores its last commit;
3. the reset callbacks run (e.g. to scale the learning rate by the new ``hvd.size()``);
4. the state is synced from the lowest rank that held it before (never from a newcomer): plain values as JSON,
   arrays as raw bytes, never a pickle;
5. the function is called again.

A loss that FAST survived by itself inside a Worker's other collectives (``worker.group.collective``: a budget's
claim, ``average_params``) changes the group without an error reaching the script: the next ``commit()`` raises
``HostsUpdatedInterrupt``, Horovod's signal that the hosts changed, and steps 3 to 5 follow from that commit.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from fast_core.config.current import run_config
from fast_core.engine import Engine
from fast_core.engine.capabilities import FaultTolerant, group_changes, world_ranks
from fast_core.engine.collectives import broadcast_arrays
from fast_core.errors import FastError, PeerLost
from fast_core.observers.base import Observers
from fast_core.observers.events import Closed, Recovered
from fast_core.runtime.builder import observers_for
from fast_core.runtime.process import init as process_engine
from fast_core.runtime.survival import MAX_SHRINKS_IN_A_ROW, reform
from fast_core.runtime.worker import Worker

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "Part", "State", "run", "track"]

log = logging.getLogger("fast")

HorovodInternalError = PeerLost
"""Horovod's name for a collective that failed because a rank was lost: FAST's PeerLost."""


class HostsUpdatedInterrupt(FastError):
    """Raised by ``State.commit()`` when the group changed since the last sync without an error reaching the
    script (a loss survived inside a Worker's own collective): ``run`` calls the reset callbacks, syncs (unless
    ``skip_sync``) and calls the function again, from the commit just made."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the group of ranks changed: the elastic run syncs and calls the function again")
        self.skip_sync = skip_sync


class Part(Protocol):
    """A framework object a state holds (a model, an optimizer) seen as named host values: NumPy arrays, which
    travel as raw bytes, and JSON data (hyper-parameters, counters). The adapters' states make one per value."""

    def read(self) -> dict[str, Any]:
        """The object's state now (arrays may share the object's memory: the caller copies what it keeps)."""

    def write(self, values: dict[str, Any]) -> None:
        """Load ``values`` (what ``read`` gave, maybe on another rank) into the object."""


class State:
    """Horovod's elastic state: ``commit()`` saves it in memory (and raises ``HostsUpdatedInterrupt`` when the
    group changed meanwhile), ``restore()`` brings the last commit back, ``sync()`` gives every rank one rank's;
    ``run`` drives them. ``engine``: the engine of this rank (None: this process's, ``fast_core.init()``)."""

    def __init__(self, engine: Engine | None = None) -> None:
        self._given_engine = engine
        self._reset_callbacks: list[Callable[[], object]] = []
        self._changes_seen = group_changes(self._engine())

    def _engine(self) -> Engine:
        return self._given_engine if self._given_engine is not None else process_engine()

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], object]]) -> None:
        """Functions called, in order, after the group changed and before the state is synced again (e.g. to scale
        the learning rate by the new ``hvd.size()``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state in memory (a copy: cheap next to a step), then check for a change of the group."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` when the group changed since the last sync. No collective: a recovery is
        collective, so every rank of the group sees the change before the same commit."""
        if group_changes(self._engine()) != self._changes_seen:
            raise HostsUpdatedInterrupt()

    def save(self) -> None:
        """Copy the state to host memory."""
        raise NotImplementedError

    def restore(self) -> None:
        """Bring back the last saved state, undoing what changed since."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every rank the state of one (collective)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Called after a change of the group, before the reset callbacks and the sync."""


class _PartValues(dict):
    """A Part's saved values (names to arrays or JSON data), told apart from a plain value that is a dict."""


class ObjectState(State):
    """State of plain values, given as keyword arguments and kept as attributes (``state.epoch``): what
    ``commit()`` saves is a copy, so ``restore()`` undoes in-place changes too. A value is JSON data (numbers,
    strings, booleans, None, lists and dicts of them: tuples come back as lists, dict keys as strings) or a NumPy
    array; an adapter's state also holds framework objects through ``part``.

    ``bcast_object`` and ``get_rank``, Horovod's own arguments, are accepted and not used: FAST syncs through the
    engine, as JSON and raw arrays. ``fast_engine``: the engine of this rank (None: this process's)."""

    def __init__(
        self, bcast_object: Any = None, get_rank: Any = None, *, fast_engine: Engine | None = None, **kwargs: Any
    ) -> None:
        super().__init__(fast_engine)
        self._names = tuple(kwargs)
        self._saved: dict[str, Any] = {}
        self._synced = False
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()

    def part(self, value: Any) -> Part | None:
        """``value`` as a Part when it is a framework object the adapter knows (a model, an optimizer), else
        None: a plain value."""
        return None

    def save(self) -> None:
        saved = {}
        for name in self._names:
            value = getattr(self, name)
            part = self.part(value)
            if part is None:
                saved[name] = _copy(value, name)
            else:
                saved[name] = _PartValues({key: _copy(v, f"{name}/{key}") for key, v in part.read().items()})
        self._saved = saved

    def restore(self) -> None:
        self._load(self._saved)

    def sync(self) -> None:
        """Every rank takes the saved plain values and the framework objects' current state of the lowest rank that
        held the state before (rank 0 at the start; never a process started to replace a lost rank), then saves
        them: the synced state is the new restore point."""
        engine = self._engine()
        root = _sync_root(engine, self._synced)
        mine = {} if engine.rank != root else self._current_parts()
        self._load(_broadcast(mine, engine, root), fresh=False)
        self._synced = True
        self.save()

    def _current_parts(self) -> dict[str, Any]:
        """The saved plain values, and the framework objects as they are now (Horovod syncs the model's current
        weights, not the committed ones)."""
        values = dict(self._saved)
        for name in self._names:
            part = self.part(getattr(self, name))
            if part is not None:
                values[name] = _PartValues(part.read())
        return values

    def _load(self, values: dict[str, Any], fresh: bool = True) -> None:
        """Set the plain values and write the parts' (copies when ``fresh``: the saved commit stays as made)."""
        for name, value in values.items():
            value = copy.deepcopy(value) if fresh else value
            if isinstance(value, _PartValues):
                part = self.part(getattr(self, name))
                if part is None:
                    raise TypeError(
                        f"elastic state attribute {name!r} held a model or optimizer and now holds "
                        f"a {type(getattr(self, name)).__name__}"
                    )
                part.write(dict(value))
            else:
                setattr(self, name, value)


def _copy(value: Any, name: str) -> Any:
    """A copy of ``value`` to save: an array's copy, else JSON data through JSON (what a sync would give)."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"elastic state attribute {name!r}: an array of Python objects cannot be sent (no pickle)")
        return value.copy()
    try:
        return json.loads(json.dumps(value, default=_number))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"elastic state attribute {name!r} is a {type(value).__name__}: FAST syncs JSON data and NumPy arrays, "
            f"never a pickle ({exc}); give numbers, strings, lists and dicts of them, or an array at the top level"
        ) from exc


def _number(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _sync_root(engine: Engine, held: bool) -> int:
    """The lowest rank that held the state before (one 8-byte allreduce), else 0."""
    lowest = np.array([engine.rank if held else engine.size], dtype=np.int64)
    engine.allreduce(lowest, op="min")
    return int(lowest[0]) % engine.size


def _plain_dtype(text: str, root: int) -> np.dtype:
    """The dtype a peer's listing names, refused when it would hold Python objects (raw bytes into pointers)."""
    dtype = np.dtype(text)
    if dtype.hasobject:
        raise TypeError(f"the elastic state rank {root} sent lists an array of Python objects ({text!r}): refused")
    return dtype


def _broadcast(values: dict[str, Any], engine: Engine, root: int) -> dict[str, Any]:
    """``root``'s values on every rank: the JSON data and a listing of the arrays (names, shapes, dtypes) as one
    text, then the arrays as one raw message (``collectives.broadcast_arrays``)."""
    arrays: list[np.ndarray] = []
    text = ""
    if engine.rank == root:
        data, listing = {}, []
        for name, value in values.items():
            if isinstance(value, _PartValues):
                data[name] = {"part": {k: v for k, v in value.items() if not isinstance(v, np.ndarray)}}
                entries = [(k, v) for k, v in value.items() if isinstance(v, np.ndarray)]
            elif isinstance(value, np.ndarray):
                entries = [(None, value)]
            else:
                data[name] = {"value": value}
                entries = []
            for key, array in entries:
                listing.append([name, key, list(array.shape), array.dtype.str])
                arrays.append(array)
        text = json.dumps({"data": data, "arrays": listing}, default=_number)
    header = json.loads(engine.broadcast_text(text, root))
    if engine.rank != root:
        arrays = [np.empty(shape, dtype=_plain_dtype(dtype, root)) for _, _, shape, dtype in header["arrays"]]
    received = broadcast_arrays(arrays, engine, root)
    out: dict[str, Any] = {
        name: _PartValues(entry["part"]) if "part" in entry else entry["value"]
        for name, entry in header["data"].items()
    }
    for (name, key, _, _), array in zip(header["arrays"], received, strict=True):
        if key is None:
            out[name] = array
        else:
            out.setdefault(name, _PartValues())[key] = array
    return out


# the Worker a run recovers through, per rank -------------------------------------------------------------------------
@dataclass
class _Rank:
    worker: weakref.ref[Worker] | None = None
    runs: int = 0


_lock = threading.Lock()
_ranks: weakref.WeakKeyDictionary[Engine, _Rank] = weakref.WeakKeyDictionary()  # by engine: LocalCluster's threads


def track(worker: Worker) -> None:
    """Make ``worker`` (a Horovod optimizer's, a Keras fit's) the one an elastic run on its engine recovers
    through: during a run, a rank lost in its step is left to the run loop. The adapters' states and Keras
    callback call it; the last one tracked on an engine counts."""
    with _lock:
        rank = _ranks.setdefault(worker.engine, _Rank())
        old = rank.worker() if rank.worker is not None else None
        if old is not None and old is not worker:
            old.group.defer_losses = False
        rank.worker = weakref.ref(worker)
        worker.group.defer_losses = rank.runs > 0


def _worked(engine: Engine) -> bool:
    """Whether a Worker was tracked on ``engine``'s rank (it writes its own run records)."""
    rank = _ranks.get(engine)
    return rank is not None and rank.worker is not None


def _tracked(engine: Engine) -> Worker | None:
    rank = _ranks.get(engine)
    worker = rank.worker() if rank is not None and rank.worker is not None else None
    return worker if worker is not None and worker.running else None


@contextmanager
def _running(engine: Engine):
    """While a run is in progress on ``engine``'s rank, its tracked Worker leaves losses in a step to the run."""
    with _lock:
        rank = _ranks.setdefault(engine, _Rank())
        rank.runs += 1
        worker = _tracked(engine)
        if worker is not None:
            worker.group.defer_losses = True
    try:
        yield
    finally:
        with _lock:
            rank.runs -= 1
            worker = _tracked(engine)
            if worker is not None and rank.runs == 0:
                worker.group.defer_losses = False


# the run loop -----------------------------------------------------------------------------------------------------
F = TypeVar("F", bound=Callable[..., Any])
_said: set[str] = set()


def run(func: F) -> F:
    """Horovod's ``@hvd.elastic.run``: ``func(state, ...)`` is called after the state is synced from rank 0; when a
    rank is lost (``fast run --fault-tolerant``) the survivors re-form the group, restore the last commit, call the
    reset callbacks, sync and call ``func`` again, until it returns. Collectives belong inside ``func``, as under
    Horovod: a process started to replace a lost rank (``--max-restarts``) runs the script from the top and meets
    the others at the sync."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(
                f"an elastic function takes the state first (hvd.elastic.ObjectState, TorchState, ...), got a "
                f"{type(state).__name__}"
            )
        engine = state._engine()
        _say_once(engine)
        observers = Observers(observers_for(run_config(), world_ranks(engine)[engine.rank], engine.size))
        with _running(engine):
            skip_sync = False
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    state._changes_seen = group_changes(engine)
                    result = func(state, *args, **kwargs)
                    break
                except PeerLost as error:
                    lost: PeerLost | None = error
                except HostsUpdatedInterrupt as interrupt:
                    lost, skip_sync = None, interrupt.skip_sync
                if lost is not None:
                    _reform(engine, lost, observers)
                    state.restore()
                    skip_sync = False
                state.on_reset()
        if not _worked(engine):  # no Worker's records say the job ran to its end: tell fast run (a "close" record)
            observers.announce(Closed(0))
        return result

    return wrapper  # type: ignore[return-value]


def _reform(engine: Engine, error: PeerLost, observers: Observers) -> None:
    """The group re-formed over the survivors (and the newcomers), by FAST's recovery: through the tracked Worker
    (its strategy, budget and step; it tells its observers), else the engine's shrink, told to ``observers`` (under
    fast run, a "membership" record); a rank lost meanwhile is survived too."""
    detected = time.time()
    for attempt in itertools.count():
        worker = _tracked(engine)
        try:
            if worker is not None:
                worker.group.recover(error, attempt)
                return
            if attempt >= MAX_SHRINKS_IN_A_ROW:
                raise PeerLost(f"{error}; {attempt} losses in a row during recovery, giving up") from error
            change = reform(engine, error)
        except PeerLost as again:
            error = again
            continue
        observers.announce(Recovered(0, change.lost, change.replaced, engine.size, detected, time.time(), change.added))
        if engine.rank == 0:
            replaced = f", new processes took over {list(change.replaced)}" if change.replaced else ""
            log.warning(
                "hvd.elastic: lost rank(s) %s%s; %d rank(s) go on from the last commit",
                list(change.lost),
                replaced,
                engine.size,
            )
        return


def _say_once(engine: Engine) -> None:
    if isinstance(engine, FaultTolerant) or engine.rank != 0 or "plain" in _said:
        return
    _said.add("plain")
    log.warning(
        "hvd.elastic.run: this job is not fault tolerant, so a lost rank ends it; run it with `fast run "
        "--fault-tolerant [--max-restarts K]` to go on without the lost rank"
    )
