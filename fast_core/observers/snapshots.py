"""Time to target of the consensus model: each rank saves its parameters at fixed wall-clock points, and after
training one rank averages the ranks' snapshots point by point and evaluates the averages.

Why offline: evaluating the average while training is a collective, so under an asynchronous strategy it would
make every rank wait for the slowest at each point, the very thing the strategy avoids. A snapshot costs one
file write of the flat parameters on this rank's trainer, no message.

- ``Snapshots`` (an Observer) saves this rank's flat parameters at ``0, every_seconds, 2 * every_seconds, ...``
  seconds since the worker's common start (``Started.started_at``; at most MAX_POINTS of them kept: a long job
  drops every other point and doubles the interval as often as needed): at the first compute end at or after each
  point, before that step's update, so the saved values are the model this rank held at that point. A rank
  reaches a point only while it trains: points after its last step are not saved. At ``close`` it also saves its
  final parameters (after the strategy's last messages landed) and a manifest ``rank<r>.json``.
- ``consensus_curve(folder, evaluate)`` (not collective; after every rank closed) averages, at each point every
  rank reached, the ranks' snapshots (in float64, like ``collectives.average_arrays``) and returns ``(time,
  evaluate(average))`` pairs; the last pair is the final consensus model at the job's stop (the last rank's last
  step). ``fast_core.runtime.consensus_curve`` attaches snapshots to a worker and does the whole end of a run
  (barrier, rank 0 evaluates and records).

Only the flat trainable parameters are saved: buffers such as BatchNorm statistics are not part of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fast_core.model.contract import ModelAdapter
from fast_core.observers.base import Observer
from fast_core.observers.events import Closed, ComputeEnded, Started, StepEnded

MAX_POINTS = 256
"""The most points a rank keeps: past it, every other point is dropped and the interval doubles (on every rank
alike, since the points are wall-clock points), so a long job's snapshots take bounded disk and its curve a
bounded evaluation at the end (a 33-minute job at 0.2 s took 3 GB and minutes of rank 0's time before)."""
FOLDER = "snapshots"
"""The snapshots' sub-folder of a run folder (``fast run``'s ``RunConfig.run_dir``)."""
FINAL = "final"

Curve = list[tuple[float, float]]


class Snapshots(Observer):
    """Save this rank's flat parameters (``params()``, e.g. the model adapter's ``params``) every ``every_seconds`` of
    wall clock since the worker's common start.

    Files: ``<folder>/rank<r>/<point>.npy`` (the point's index; one file per point, so a step spanning several
    points writes the same values under each) and, at close, ``<folder>/rank<r>/final.npy`` and the manifest
    ``<folder>/rank<r>.json`` (written last: its presence says the rank's snapshots are complete).
    """

    def __init__(
        self, folder: Path | str, every_seconds: float, rank: int, params: Callable[[], np.ndarray]
    ) -> None:
        if isinstance(every_seconds, bool) or not isinstance(every_seconds, int | float) or not every_seconds > 0:
            raise ValueError(f"Snapshots(every_seconds={every_seconds!r}): give the seconds between snapshots, > 0")
        self.folder = Path(folder)
        self.every = float(every_seconds)
        self.rank = rank
        self.points = 0
        """Points reached so far: 0 .. points - 1 (those kept: the multiples of ``stride``)."""
        self.stride = 1
        """Only points that are multiples of this are kept; it doubles whenever more than MAX_POINTS would be."""
        self.stop = 0.0
        """Seconds from the common start to this rank's last step end."""
        self._params = params
        self._origin: float | None = None
        self._dir = self.folder / f"rank{rank}"

    # events -------------------------------------------------------------------------------------------------------
    def on_start(self, event: Started) -> None:
        self._origin = event.started_at
        self._dir.mkdir(parents=True, exist_ok=True)
        self._save_due()  # point 0: the common start model

    def on_compute_end(self, event: ComputeEnded) -> None:
        self._save_due()

    def on_step_end(self, event: StepEnded) -> None:
        self.stop = self._elapsed()

    def on_close(self, event: Closed) -> None:
        if self._origin is None:
            return
        np.save(self._dir / f"{FINAL}.npy", self._params())
        manifest = {
            "rank": self.rank,
            "every_seconds": self.every,
            "points": self.points,
            "stride": self.stride,
            "stop": self.stop,
        }
        (self.folder / f"rank{self.rank}.json").write_text(json.dumps(manifest), encoding="utf-8")

    # ---------------------------------------------------------------------------------------------------------------
    def _elapsed(self) -> float:
        return time.monotonic() - self._origin if self._origin is not None else 0.0

    def _save_due(self) -> None:
        if self._origin is None:
            return
        due = int(self._elapsed() // self.every) + 1  # points 0 .. due - 1 have been reached
        if due <= self.points:
            return
        params = self._params()
        for point in range(self.points, due):
            if point % self.stride == 0:
                np.save(self._dir / f"{point}.npy", params)
        self.points = due
        while -(-self.points // self.stride) > MAX_POINTS:  # kept: the multiples of stride below points
            for point in range(self.stride, self.points, 2 * self.stride):
                (self._dir / f"{point}.npy").unlink(missing_ok=True)
            self.stride *= 2


def consensus_curve(folder: Path | str, evaluate: Callable[[np.ndarray], float], size: int | None = None) -> Curve:
    """``(seconds since the common start, evaluate(average of the ranks' snapshots))`` at every point all ranks
    reached, then at the job's stop (the last rank's last step) for the final consensus model.

    Not collective: call it on one rank after every rank closed its worker. ``size``: the job's ranks (checked
    against the manifests found; default: as many as there are). Averages are summed in float64 and cast back to
    the snapshots' dtype, as ``collectives.average_arrays`` does.
    """
    manifests = read_manifests(folder, size)
    every = manifests[0]["every_seconds"]
    common = min(m["points"] for m in manifests)
    stride = max(m.get("stride", 1) for m in manifests)  # a rank that stopped a point later may have thinned once more
    size = len(manifests)
    points = range(0, common, stride)
    curve = [(point * every, evaluate(average_snapshots(folder, size, str(point)))) for point in points]
    stop = max(m["stop"] for m in manifests)
    curve.append((stop, evaluate(average_snapshots(folder, size, FINAL))))
    return curve


def read_manifests(folder: Path | str, size: int | None = None) -> list[dict]:
    """Every rank's manifest, rank 0 first; a one-line error when a rank's is missing or they disagree."""
    folder = Path(folder)
    found = sorted(folder.glob("rank*.json"), key=lambda p: int(p.stem[len("rank") :]))
    size = len(found) if size is None else size
    manifests = []
    for rank in range(size):
        path = folder / f"rank{rank}.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: rank {rank} did not close its worker with snapshots (call consensus_curve "
                "after every rank's close and a barrier)"
            )
        manifests.append(json.loads(path.read_text(encoding="utf-8")))
    if not manifests:
        raise FileNotFoundError(f"no snapshots in {folder}: attach Snapshots to the worker before training")
    if len({m["every_seconds"] for m in manifests}) > 1:
        raise ValueError(f"the ranks' snapshots in {folder} were taken at different intervals: one run per folder")
    return manifests


def average_snapshots(folder: Path | str, size: int, name: str) -> np.ndarray:
    """The mean over ranks of snapshot ``name`` (a point's index or "final"), in the snapshots' dtype."""
    total: np.ndarray | None = None
    dtype = None
    for rank in range(size):
        values = np.load(Path(folder) / f"rank{rank}" / f"{name}.npy", allow_pickle=False)
        dtype = values.dtype
        total = values.astype(np.float64) if total is None else total + values
    return (total / size).astype(dtype)


@contextmanager
def loaded(model: ModelAdapter, flat: np.ndarray) -> Iterator[ModelAdapter]:
    """``model`` holding ``flat`` inside the block, its own parameters again after it (to evaluate a snapshot)."""
    own = np.array(model.params(), copy=True)
    model.set_params(flat)
    try:
        yield model
    finally:
        model.set_params(own)


def curve_text(curve: Curve, name: str = "validation accuracy") -> str:
    """One line for a script's output: the consensus curve's start, best and final values."""
    (start, first), (stop, final) = curve[0], curve[-1]
    best_time, best = max(curve, key=lambda point: point[1])
    return (
        f"consensus model's {name} over {len(curve)} points ({start:.1f} s to {stop:.1f} s since the common start): "
        f"{first:.4f} at the start, best {best:.4f} at {best_time:.1f} s, {final:.4f} at the job's stop"
    )
