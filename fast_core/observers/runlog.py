"""The run folder `fast run` gives a job: one JSON-lines file of records per rank, and how to read them back.

A record is one flat JSON object: ``kind`` ("start", "step", "epoch", "close", "result", "consensus", "membership"),
``rank``, ``step``, ``time`` (seconds since the worker started) and numbers: what the script recorded, the worker's
counters (cumulative: ``bytes_sent``, ``wait_seconds``, ``compute_seconds``, ``mean_staleness``,
``refused_messages``, ...), the last ``consensus_distance`` computed, ``samples_left`` under a sample budget, and in
"step" records ``steps_per_second`` since the previous one. The launcher passes the folder and its options to the
ranks through the run configuration (``fast_core.config.run``), so scripts need no argument parsing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

COUNTERS = (
    "bytes_sent",
    "bytes_received",
    "messages_sent",
    "wait_seconds",
    "mean_staleness",
    "staleness_max",
    "refused_messages",
)
"""The worker's counters copied into every record (cumulative), besides ``compute_seconds``, the consensus distance
and the samples left."""
RUN_FILE = "run.json"
"""The launcher's description of the job (command, ranks, strategy, exit code) in the run folder."""


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.jsonl"


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


def rank_files(run_dir: Path) -> dict[int, Path]:
    """The ranks' record files in ``run_dir``, by rank."""
    found = {}
    for path in Path(run_dir).glob("rank*.jsonl"):
        suffix = path.stem[len("rank") :]
        if suffix.isdigit():
            found[int(suffix)] = path
    return found


def run_sizes(run_dir: Path) -> dict[int, int]:
    """Bytes in each rank's file now: a launch into a reused run folder reads its own records after them."""
    return {rank: path.stat().st_size for rank, path in rank_files(run_dir).items()}


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The records in ``data`` (whole lines of a rank file) and how many lines were no record: a line cut short by a
    killed rank (or two lines run together after it) is skipped and counted, never fatal to a reader."""
    records, skipped = [], 0
    for line in data.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            skipped += 1
    return records, skipped


class Tail:
    """One rank file read as it grows (a live job): each ``read`` gives the whole records written since the last
    one; a line still being written waits for the next read."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset  # a reused run folder's earlier runs are not this one
        self.skipped = 0  # lines that were no record, so far

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        records, bad = parse_lines(whole)
        self.skipped += bad
        return records


def read_run(
    run_dir: Path, after: Mapping[int, int] | None = None, skipped: dict[int, int] | None = None
) -> dict[int, list[dict[str, Any]]]:
    """Every rank's records, in the order written (``after``: each rank file's bytes to pass over, ``run_sizes``
    before a launch); a line cut short by a killed rank is skipped, and counted per rank in ``skipped`` if given."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    for rank, path in sorted(rank_files(run_dir).items()):
        ranks[rank], bad = parse_lines(path.read_bytes()[(after or {}).get(rank, 0) :])
        if skipped is not None and bad:
            skipped[rank] = bad
    return dict(sorted(ranks.items()))
