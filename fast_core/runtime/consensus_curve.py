"""The consensus model over time for a Worker (``fast_core.observers.snapshots`` saves and averages the files):
attach the snapshots before training, record the curve after it."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fast_core.observers.snapshots import Curve, Snapshots, consensus_curve, loaded
from fast_core.runtime.worker import Worker

log = logging.getLogger("fast")


def attach_snapshots(worker: Worker, folder: Path | str, every_seconds: float) -> Snapshots:
    """Save ``worker``'s parameters every ``every_seconds`` since the common start, into ``folder``; also when the
    worker has already started (point 0 is then saved now: call it before the first step, as adapters that start
    the worker at wrap time need)."""
    return worker.observers.attach(Snapshots(folder, every_seconds, worker.engine.rank, worker.model.params))


def record_consensus_curve(
    worker: Worker, snapshots: Snapshots, metric: Callable[[], float], name: str = "val_accuracy", keep: bool = False
) -> Curve:
    """The end of a run with snapshots (collective, after ``worker.close()``): a barrier so every rank's snapshots
    are complete, then rank 0 evaluates ``metric()`` (higher is better, e.g. validation accuracy of the model the
    worker trains) with each consensus snapshot loaded into the worker's model, and records each as a "consensus"
    record ``{time, <name>}`` (``worker.records.consensus``). Its model is restored after each evaluation.
    Returns the curve on rank 0, [] elsewhere. The snapshot files are removed unless ``keep``. A job whose
    group changed (``fast run --fault-tolerant``: ranks lost, or joined) has no curve: the snapshots of a lost rank
    stop where it died, a newcomer's start where it joined."""
    worker.group.collective(worker.engine.barrier)
    recoveries, rank = worker.group.recoveries, worker.engine.rank
    if rank != 0 or recoveries:
        if recoveries and rank == 0:
            log.warning(
                "no consensus curve: the group changed during the run (ranks lost or joined), so the snapshots do not "
                "cover every rank at every time"
            )
        return []

    def evaluate(flat: np.ndarray) -> float:
        with loaded(worker.model, flat):
            return float(metric())

    curve = consensus_curve(snapshots.folder, evaluate, worker.engine.size)
    for seconds, value in curve:
        worker.records.consensus(time=seconds, **{name: value})
    if not keep:
        shutil.rmtree(snapshots.folder, ignore_errors=True)
    return curve
