"""What a Worker reports under `fast run`: per-rank records in the run folder, rank 0's bar, lines on request.

Scripts hand over what only they know (``worker.record(loss=..., samples=...)`` each step,
``worker.record_epoch(val_accuracy=...)``, ``worker.record_result(test_accuracy=...)``); the Worker adds its step
count and metrics (bytes, waits, staleness, the last consensus distance the script computed) and writes a "step"
record every ``FAST_LOG_EVERY`` steps. Nothing here is collective, and without the environment variables that
`fast run` sets the Worker has no Reporter at all.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import RunConfig
from .observers import Observer
from .progress import ProgressBar, print_record
from .runlog import RunLog, rank_file

if TYPE_CHECKING:
    from .worker import Worker

METRICS = ("bytes_sent", "bytes_received", "messages_sent", "wait_seconds", "mean_staleness", "staleness_max")
"""The Worker's counters copied into every record (cumulative), besides the consensus distance."""
SUMMED = "samples"
"""The one recorded value that adds up (a running total); every other value is averaged between records."""


class Reporter(Observer):
    """One rank's reporting: averages recorded values between records, writes them, feeds the bar."""

    records = True

    def __init__(
        self, rank: int, run_dir: Path | None, every: int, progress: bool, verbose: bool, label: str = ""
    ) -> None:
        self.rank = rank
        self.every = every
        self.log = RunLog(rank_file(run_dir, rank)) if run_dir is not None else None
        self._progress = progress and rank == 0
        self._verbose = verbose
        self._label = label
        self._bar: ProgressBar | None = None
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._samples = 0.0
        self._epochs = 0
        self._last_step = -1
        self._step_time = 0.0  # seconds from the start to the end of the last step (closing may wait for peers)
        self._start = time.perf_counter()

    # Worker events -----------------------------------------------------------------------------------------------
    def on_start(self, worker: Worker) -> None:
        self._start = time.perf_counter()
        if self._progress:
            self._bar = ProgressBar(self._label or worker.strategy.name)
        meta = {"size": worker.size, "strategy": repr(worker.strategy), "host": socket.gethostname()}
        self._emit(worker, "start", {**meta, "pid": os.getpid(), "log_every": self.every})

    def on_record(self, worker: Worker, kind: str, values: dict[str, Any]) -> None:
        if kind == "epoch":
            self._epochs += 1
            self._emit(worker, "epoch", {"epoch": self._epochs, **values})
        elif kind in ("result", "consensus"):
            self._emit(worker, kind, values)
        else:
            self._add(values)

    def _add(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == SUMMED:
                self._samples += float(value)
            else:
                self._sums[key] = self._sums.get(key, 0.0) + float(value)
                self._counts[key] = self._counts.get(key, 0) + 1

    def on_step_end(self, worker: Worker) -> None:
        self._step_time = time.perf_counter() - self._start
        if self._bar is not None:
            self._bar.update()
        if worker.step % self.every == 0:
            self._emit(worker, "step", self._interval())

    def on_close(self, worker: Worker) -> None:
        """The last values, then a "close" record with the totals; the bar ends. Results may still follow."""
        if self._counts and worker.step != self._last_step:
            self._emit(worker, "step", self._interval())
        self._emit(worker, "close", {SUMMED: self._samples, "step_time": self._step_time})
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ---------------------------------------------------------------------------------------------------------------
    def _interval(self) -> dict[str, Any]:
        """Mean of each value recorded since the last step record, and the running total of samples."""
        means = {key: self._sums[key] / self._counts[key] for key in self._sums}
        self._sums.clear()
        self._counts.clear()
        return {**means, SUMMED: self._samples}

    def _emit(self, worker: Worker, kind: str, values: dict[str, Any]) -> None:
        metrics = worker.metrics.as_dict()
        record = {"kind": kind, "rank": self.rank, "step": worker.step, "time": time.perf_counter() - self._start}
        record.update({key: metrics[key] for key in METRICS})
        record["consensus_distance"] = metrics["consensus_distance"]
        record.update(values)
        if kind == "step":
            self._last_step = worker.step
        if self.log is not None:
            self.log.write(record)
        if self._bar is not None and kind in ("step", "epoch"):
            self._bar.show(record)
        if self._verbose and (self._bar is None or kind not in ("step", "epoch")):
            print_record(record)


def epoch_summary(worker: Worker, loss: float) -> tuple[float, float | None]:
    """An epoch's loss averaged over ranks and the consensus distance, for synchronous strategies; for asynchronous
    ones this rank's own loss and None.

    Both numbers are collectives: under an asynchronous strategy they would hold every rank to the slowest one's
    pace once an epoch, undoing what the strategy is for (a straggler would set everyone's speed).
    """
    if not worker.strategy.lockstep:
        return loss, None
    total = np.array([loss], dtype=np.float64)
    worker.engine.allreduce(total)
    return float(total[0]) / worker.size, worker.consensus_distance()


def reporter_from_environment(rank: int) -> Reporter | None:
    """The Reporter `fast run` asks for through the environment, or None when it asks for nothing."""
    config = RunConfig.from_environment()
    if not config.reporting:
        return None
    return Reporter(rank, config.run_dir, config.log_every, config.progress, config.verbose, config.label)
