"""What a run shows while it trains: rank 0's progress bar, and one line per record from every rank on request.

The bar is tqdm's, on rank 0's stdout; while it is open, the script's own prints go through ``tqdm.write`` so they
appear above the bar instead of through it. tqdm is imported only when a bar is shown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

SHOWN = {"loss": "loss", "consensus_distance": "consensus", "epoch": "epoch"}
"""Record keys the bar shows, with their label; steps/s is the bar's own rate."""


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class _AboveBar:
    """Stands in for sys.stdout while the bar is open: complete lines are written above the bar."""

    def __init__(self, stream: TextIO, write_line) -> None:
        self._stream = stream
        self._write_line = write_line
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._write_line(line)
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._write_line(self._pending)
            self._pending = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ... of the real stream
        return getattr(self._stream, name)


class ProgressBar:
    """A tqdm bar counting steps (its rate is steps/s), with the latest loss, consensus distance and epoch."""

    def __init__(self, label: str) -> None:
        from tqdm import tqdm

        self._stdout = sys.stdout
        columns = os.environ.get("COLUMNS", "")  # the launcher's terminal width: a rank's stdout is a pipe
        self._bar = tqdm(
            desc=label,
            unit=" steps",
            file=self._stdout,
            ncols=int(columns) if columns.isdigit() else 100,
            mininterval=0.2,
        )
        sys.stdout = _AboveBar(self._stdout, lambda line: tqdm.write(line, file=self._stdout))

    def update(self, steps: int = 1) -> None:
        self._bar.update(steps)

    def show(self, record: Mapping[str, Any]) -> None:
        shown = {label: _short(record[key]) for key, label in SHOWN.items() if record.get(key) is not None}
        self._bar.set_postfix(shown, refresh=False)

    def close(self) -> None:
        if isinstance(sys.stdout, _AboveBar):
            sys.stdout.flush()
            sys.stdout = self._stdout
        self._bar.close()


def record_line(record: Mapping[str, Any]) -> str:
    """One record as a line: ``rank 2 step 40 at 1.92 s, step record: loss 0.412, samples 640, ...``."""
    head = f"rank {record.get('rank')} step {record.get('step')} at {record.get('time', 0.0):.2f} s"
    rest = ", ".join(
        f"{key} {_short(value)}"
        for key, value in record.items()
        if key not in ("rank", "kind", "step", "time") and value is not None
    )
    return f"{head}, {record.get('kind')} record: {rest}"


def print_record(record: Mapping[str, Any]) -> None:
    """One write of the whole line: ``print`` writes the newline separately, and on an unbuffered stderr (as
    ``fast run`` sets) another rank's line could then land between a line and its newline."""
    sys.stderr.write(record_line(record) + "\n")
    sys.stderr.flush()
