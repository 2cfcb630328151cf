"""What a rank reports under `fast run`: per-rank records in the run folder, rank 0's bar, lines on request.

Scripts hand over what only they know (``worker.records.step(loss=..., samples=...)`` each step,
``worker.records.epoch(val_accuracy=...)``, ``worker.records.result(test_accuracy=...)``); the Reporter adds the
step count and the worker's counters (bytes, waits, staleness, the last consensus distance the script computed,
the samples a sample budget has left) and writes a "step" record every ``FAST_LOG_EVERY`` steps, with the steps per
second since the last one. Each record goes to the run folder and, when asked for, to TensorBoard
(``fast_core.observers.tensorboard``): the same record to both. Nothing here is collective, and without the
environment variables that `fast run` sets (or a Worker's ``tensorboard=``) the Worker has no Reporter at all.

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
from typing import Any

from fast_core.metrics import Metrics
from fast_core.observers.base import Observer
from fast_core.observers.events import Closed, ComputeEnded, Recorded, Recovered, Started, StepEnded
from fast_core.observers.progress import ProgressBar, print_record
from fast_core.observers.runlog import COUNTERS, RunLog, rank_file
from fast_core.observers.straggler import Straggler
from fast_core.observers.tensorboard import TensorBoard

SUMMED = "samples"
"""The one recorded value that adds up (a running total); every other value is averaged between records."""


class Reporter(Observer):
    """One rank's reporting: averages recorded values between records, writes them, feeds the bar."""

    records = True

    def __init__(
        self,
        rank: int,
        run_dir: Path | None,
        every: int,
        progress: bool,
        verbose: bool,
        label: str = "",
        straggler: Straggler | None = None,
        tensorboard: Path | None = None,
    ) -> None:
        self.rank = rank
        self.every = every
        self.log = RunLog(rank_file(run_dir, rank)) if run_dir is not None else None
        self.tensorboard = TensorBoard(tensorboard, rank) if tensorboard is not None else None
        """The same records as TensorBoard scalars (``fast_core.observers.tensorboard``), made before training."""
        self._progress = progress and rank == 0
        self._verbose = verbose
        self._label = label
        self._bar: ProgressBar | None = None
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._samples = 0.0
        self._epochs = 0
        self._last_step = -1
        self._rate_from = (0, 0.0)  # (step, time) of the last step record (or the start): steps/s since then
        self._step_time = 0.0  # seconds from the start to the end of the last step (closing may wait for peers)
        self._wall_stop: float | None = None  # time.time() at the end of the last step
        self._compute = 0.0  # the steps' compute seconds, summed
        self._start = time.perf_counter()
        self._straggler = straggler  # its sleep goes into the "close" record
        self._metrics = Metrics()  # the worker's live counters, from the start (zeros until then)

    # events -------------------------------------------------------------------------------------------------------
    def on_start(self, event: Started) -> None:
        wall = time.time()
        self._start = time.perf_counter()
        self._metrics = event.metrics
        self._rate_from = (event.step, 0.0)
        if self._progress:
            self._bar = ProgressBar(self._label or event.strategy_name)
        meta = {"size": event.size, "strategy": event.strategy, "host": socket.gethostname()}
        if event.budget_samples is not None or event.budget_seconds is not None:  # the job's total, for fast run's bar
            meta.update(budget_samples=event.budget_samples, budget_seconds=event.budget_seconds)
        self._emit(event.step, "start", {**meta, "pid": os.getpid(), "log_every": self.every, "wall_start": wall})

    def on_compute_end(self, event: ComputeEnded) -> None:
        self._compute += event.compute_seconds  # measured before any observer ran: a straggler's sleep is not in it

    def on_record(self, event: Recorded) -> None:
        values = dict(event.values)
        if event.kind == "step":
            self._add(values)
            return
        if event.kind == "epoch":
            self._epochs += 1
            values = {"epoch": self._epochs, **values}
        self._emit(event.step, event.kind, values)  # "result", and any other kind (e.g. "consensus") as its own

    def on_recovery(self, event: Recovered) -> None:
        self._emit(event.step, "membership", event.as_record())

    def _add(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            if key == SUMMED:
                self._samples += float(value)
            else:
                self._sums[key] = self._sums.get(key, 0.0) + float(value)
                self._counts[key] = self._counts.get(key, 0) + 1

    def on_step_end(self, event: StepEnded) -> None:
        now = time.perf_counter()
        self._wall_stop = time.time()  # read after the step clock, as wall_start before it: the job's span holds it
        self._step_time = now - self._start
        if self._bar is not None:
            self._bar.update()
        if event.step % self.every == 0:
            self._emit(event.step, "step", self._interval())

    def on_close(self, event: Closed) -> None:
        """The last values, then a "close" record with the totals; the bar ends. Results may still follow."""
        if self._counts and event.step != self._last_step:
            self._emit(event.step, "step", self._interval())
        closing = {SUMMED: self._samples, "step_time": self._step_time, "wall_stop": self._wall_stop}
        if self._straggler is not None:
            closing["straggler_slept"] = self._straggler.slept  # seconds this rank slept as the simulated straggler
        if event.time_split is not None:
            closing.update(event.time_split)  # fast run --profile: time_<phase>_<part> seconds
        self._emit(event.step, "close", closing)
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

    def _rate(self, step: int, now: float) -> float:
        """Steps per second since the last step record (or the start)."""
        first_step, first_time = self._rate_from
        self._rate_from = (step, now)
        return (step - first_step) / (now - first_time) if now > first_time else 0.0

    def _emit(self, step: int, kind: str, values: dict[str, Any]) -> None:
        metrics = self._metrics.as_dict()
        record = {"kind": kind, "rank": self.rank, "step": step, "time": time.perf_counter() - self._start}
        record.update({key: metrics[key] for key in COUNTERS})
        record["compute_seconds"] = self._compute
        record["consensus_distance"] = metrics["consensus_distance"]
        if metrics["samples_left"] is not None:
            record["samples_left"] = metrics["samples_left"]
        if kind == "step":
            record["steps_per_second"] = self._rate(step, record["time"])
        record.update(values)
        if kind == "step":
            self._last_step = step
        if self.log is not None:
            self.log.write(record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        if self._bar is not None and kind in ("step", "epoch"):
            self._bar.show(record)
        if self._verbose and (self._bar is None or kind not in ("step", "epoch")):
            print_record(record)
