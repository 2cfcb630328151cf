"""The run folder read as the job writes it: every rank's records so far, the launcher's run.json, the ranks' bad
endings. The dashboard's one source of truth is what the job already writes; nothing here writes anything."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fast_core.cli.job_bar import RankSamples
from fast_core.cli.launch import EXITS, bad_exits
from fast_core.observers.runlog import RUN_FILE, rank_files
from fast_core.runtime.uncaught import read_errors


@dataclass
class RankFile:
    """One rank's file: its records so far, the samples of its processes, when it last grew."""

    samples: RankSamples
    records: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0
    changed: float = 0.0
    """``time.time()`` of the file's last write (its mtime): how long a live rank has been silent."""


class RunFolder:
    """Follows one run folder: ``refresh`` takes in what was written since the last call (new ranks included)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.ranks: dict[int, RankFile] = {}
        self.run: dict[str, Any] = {}
        self.exits: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.read_at = 0.0

    def refresh(self) -> bool:
        """Read what is new; True when anything changed since the last call."""
        changed = False
        for rank, path in rank_files(self.path).items():
            if rank not in self.ranks:
                self.ranks[rank] = RankFile(RankSamples(path))
                changed = True
            state = self.ranks[rank]
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            if stat.st_size != state.size:
                state.records += state.samples.read()
                state.size, state.changed, changed = stat.st_size, stat.st_mtime, True
        run = _json(self.path / RUN_FILE)
        if run != self.run:
            self.run, changed = run, True
        exits, errors = bad_exits(self.path / EXITS), read_errors(self.path)
        if (exits, errors) != (self.exits, self.errors):
            self.exits, self.errors, changed = exits, errors, True
        self.ranks = dict(sorted(self.ranks.items()))
        self.read_at = time.time()
        return changed

    @property
    def records(self) -> dict[int, list[dict[str, Any]]]:
        """Every rank's records so far, as ``runlog.read_run`` gives a finished run's."""
        return {rank: state.records for rank, state in self.ranks.items()}

    @property
    def skipped(self) -> dict[int, int]:
        """Lines that were no record (a job killed mid-write), per rank that has any."""
        return {rank: state.samples.skipped for rank, state in self.ranks.items() if state.samples.skipped}


def _json(path: Path) -> dict[str, Any]:
    """A JSON file's object; {} while it is missing or half written (the launcher rewrites run.json at the end)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
