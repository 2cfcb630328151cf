"""What a Worker reports under `fast run`: per-rank records in the run folder, rank 0's bar, lines on request.

Scripts hand over what only they know (``worker.record(loss=..., samples=...)`` each step,
``worker.record_epoch(val_accuracy=...)``, ``worker.record_result(test_accuracy=...)``); the Worker adds its step
count and metrics (bytes, waits, staleness, the last consensus distance the script computed) and writes a "step"
record every ``FAST_LOG_EVERY`` steps. Nothing here is collective, and without the environment variables that
`fast run` sets the Worker has no Reporter at all.

Times, for honest job figures (``fast bench``): every record's ``time`` counts seconds since the worker's start,
which is collective, so it is the job's common start on every rank; the "start" record also holds it as wall-clock
(``wall_start``, ``time.time()``) and the "close" record holds the wall-clock of this rank's stop, the end of its
last step (``wall_stop``; ``step_time`` is the same point in seconds since the start), so the job's wall-clock runs
from the earliest ``wall_start`` to the latest ``wall_stop``. Every record carries ``compute_seconds``: this rank's
time so far from each step's end to the next step's gradient hook (forward, backward, data loading; the simulated
straggler's sleep and the epochs' evaluations excluded), which ``fast bench`` calibrates its straggler from.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fast_core.config.run import RunConfig
from fast_core.observers.base import Observer
from fast_core.observers.progress import ProgressBar, print_record
from fast_core.observers.runlog import RunLog, rank_file
from fast_core.observers.straggler import Straggler

if TYPE_CHECKING:
    from fast_core.runtime.worker import Worker

METRICS = (
    "bytes_sent",
    "bytes_received",
    "messages_sent",
    "wait_seconds",
    "mean_staleness",
    "staleness_max",
    "refused_messages",
)
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
        self._wall_stop: float | None = None  # time.time() at the end of the last step
        self._compute = 0.0  # the worker's step_compute, summed
        self._start = time.perf_counter()

    # Worker events -----------------------------------------------------------------------------------------------
    def on_start(self, worker: Worker) -> None:
        wall = time.time()
        self._start = time.perf_counter()
        if self._progress:
            self._bar = ProgressBar(self._label or worker.strategy.name)
        meta = {"size": worker.size, "strategy": repr(worker.strategy), "host": socket.gethostname()}
        if worker.budget is not None:  # the job's total, for fast run's bar (a script's --epochs is known only here)
            meta.update(budget_samples=worker.budget.samples, budget_seconds=worker.budget.seconds)
        self._emit(worker, "start", {**meta, "pid": os.getpid(), "log_every": self.every, "wall_start": wall})

    def on_compute_end(self, worker: Worker) -> None:
        self._compute += worker.step_compute  # measured before any observer ran: a straggler's sleep is not in it

    def on_record(self, worker: Worker, kind: str, values: dict[str, Any]) -> None:
        if kind == "step":
            self._add(values)
            return
        if kind == "epoch":
            self._epochs += 1
            values = {"epoch": self._epochs, **values}
        self._emit(worker, kind, values)  # "result", and any other kind (e.g. "consensus") as its own record

    def _add(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == SUMMED:
                self._samples += float(value)
            else:
                self._sums[key] = self._sums.get(key, 0.0) + float(value)
                self._counts[key] = self._counts.get(key, 0) + 1

    def on_step_end(self, worker: Worker) -> None:
        now = time.perf_counter()
        self._wall_stop = time.time()  # read after the step clock, as wall_start before it: the job's span holds it
        self._step_time = now - self._start
        if self._bar is not None:
            self._bar.update()
        if worker.step % self.every == 0:
            self._emit(worker, "step", self._interval())

    def on_close(self, worker: Worker) -> None:
        """The last values, then a "close" record with the totals; the bar ends. Results may still follow."""
        if self._counts and worker.step != self._last_step:
            self._emit(worker, "step", self._interval())
        closing = {SUMMED: self._samples, "step_time": self._step_time, "wall_stop": self._wall_stop}
        slept = [o.slept for o in worker.observers if isinstance(o, Straggler)]
        if slept:
            closing["straggler_slept"] = sum(slept)  # seconds this rank slept as the simulated straggler
        self._emit(worker, "close", closing)
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
        record["compute_seconds"] = self._compute
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
    worker.run_collective(lambda: worker.engine.allreduce(total))  # survives a lost rank under --fault-tolerant
    return float(total[0]) / worker.size, worker.consensus_distance()


def reporter_from_environment(rank: int) -> Reporter | None:
    """The Reporter `fast run` asks for through the environment, or None when it asks for nothing."""
    config = RunConfig.from_environment()
    if not config.reporting:
        return None
    return Reporter(rank, config.run_dir, config.log_every, config.progress, config.verbose, config.label)
