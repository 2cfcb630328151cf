"""`fast run`'s progress bar: the whole job's samples, every rank's, over the job's budget, with tqdm's rate and ETA.

A rank's own bar could only count its own steps; the job's figure is the sum over ranks, which the launcher reads
from the ranks' records as they are written (each "step" record holds its rank's running total of samples, every
``--log-every`` steps). The total is the sample budget rank 0's "start" record names (``--budget-samples``, or the
``Budget`` a script built from its ``--epochs``); without one the bar shows the count and the rate only. The ranks'
lines pass above the bar (``show``), stdout and stderr each to its own stream.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO

from fast_core.observers.runlog import Tail, rank_file

POLL_SECONDS = 0.25


class RankSamples:
    """One rank's records file read as it grows: the samples its processes trained (a replacement started by
    ``--max-restarts`` writes its own "start" record and counts from 0 again)."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self._tail = Tail(path, offset)  # a reused run folder's earlier runs are not this one
        self._earlier = 0.0  # the samples of processes that wrote this file before the current one
        self._current = 0.0
        self.start: dict | None = None

    @property
    def samples(self) -> float:
        return self._earlier + self._current

    @property
    def skipped(self) -> int:
        """Lines of the file that were no record (cut short by a killed rank)."""
        return self._tail.skipped

    def read(self) -> list[dict]:
        """Take in the whole records written since the last read (a line being written waits for the next); returns
        them."""
        records = self._tail.read()
        for record in records:
            if record.get("kind") == "start":
                self._earlier, self._current = self.samples, 0.0
                self.start = self.start or record
            elif record.get("samples") is not None:
                self._current = float(record["samples"])
        return records


class JobBar:
    """A tqdm bar on stderr, fed from the run folder by a thread every ``POLL_SECONDS`` until ``close``."""

    def __init__(self, run_dir: Path, workers: int, label: str, after: dict[int, int]) -> None:
        """``after``: each rank file's bytes before this launch (``runlog.run_sizes``)."""
        from tqdm import tqdm

        self._ranks = [RankSamples(rank_file(run_dir, rank), after.get(rank, 0)) for rank in range(workers)]
        self._bar = tqdm(
            desc="job" if label == "default" else label,
            unit=" samples",
            file=sys.stderr,
            mininterval=0.2,
            dynamic_ncols=True,
        )
        self._started = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self.update()

    def update(self) -> None:
        """Read the ranks' new records and move the bar to the job's samples (its total once rank 0 names one)."""
        for rank in self._ranks:
            rank.read()
        start = self._ranks[0].start
        if start is not None and not self._started:  # the bar's clock (rate, ETA) from the job's common start
            self._started = True
            self._bar.reset(total=start.get("budget_samples"))
            self._bar.start_t -= max(0.0, time.time() - start.get("wall_start", time.time()))
        done = int(sum(rank.samples for rank in self._ranks))
        if done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def show(self, lines: bytes, target: BinaryIO) -> None:
        """Write the ranks' ``lines`` to ``target`` (our stdout or stderr) above the bar."""
        text_stream = sys.stdout if target is getattr(sys.stdout, "buffer", None) else sys.stderr
        with self._bar.external_write_mode(file=text_stream):
            sys.stderr.flush()
            target.write(lines)
            target.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.update()
        self._bar.refresh()  # drawn once at its end, however short the job (then cleared: the rate line follows)
        self._bar.close()
