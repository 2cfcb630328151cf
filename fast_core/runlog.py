"""The run folder `fast run` gives a job: one JSON-lines file of records per rank, and how to read them back.

A record is one flat JSON object: ``kind`` ("start", "step", "epoch", "close", "result"), ``rank``, ``step``,
``time`` (seconds since the worker started) and numbers. The launcher passes the folder and its options to the
ranks through the environment variables below, so scripts need no argument parsing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

RUN_DIR_VARIABLE = "FAST_RUN_DIR"
"""The run folder; each rank appends its records to ``rank<r>.jsonl`` there."""
LOG_EVERY_VARIABLE = "FAST_LOG_EVERY"
"""A "step" record every this many steps (default 10)."""
PROGRESS_VARIABLE = "FAST_PROGRESS"
"""1: rank 0 shows a progress bar (``fast run`` sets it when its output is a terminal)."""
VERBOSE_VARIABLE = "FAST_VERBOSE"
"""1: every rank prints its records as lines on stderr."""
LABEL_VARIABLE = "FAST_RUN_LABEL"
"""What the progress bar calls the run (``fast run`` passes the strategy string)."""
DEFAULT_LOG_EVERY = 10
RUN_FILE = "run.json"
"""The launcher's description of the job (command, ranks, strategy, exit code) in the run folder."""


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.jsonl"


def flag(name: str) -> bool:
    """An environment variable used as a switch: set and not 0/false/no."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def plain(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with NumPy scalars as Python numbers and NaN or infinities as None, so it is strict JSON."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if hasattr(value, "item") and not isinstance(value, str):
            value = value.item()  # NumPy (or framework) scalars
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out


class RunLog:
    """Appends records to one rank's file, flushed at once so an interrupted run keeps what it wrote."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        if self._file is None:  # opened on the first record, then kept open for the whole run
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(plain(record), allow_nan=False) + "\n")
        self._file.flush()


def read_run(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's records, in the order written; a line cut short by a killed rank is skipped."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(run_dir).glob("rank*.jsonl")):
        suffix = path.stem[len("rank") :]
        if not suffix.isdigit():
            continue
        records = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        ranks[int(suffix)] = records
    return dict(sorted(ranks.items()))
