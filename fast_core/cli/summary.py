"""`fast bench`'s table: one row per run, computed from the run's per-rank records (fast_core.runlog)."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

Records = dict[int, list[dict[str, Any]]]


@dataclass
class Row:
    """What one run measured. None: not recorded (the example does not report it, or the run failed)."""

    label: str
    mode: str  # sync, async, or "DDP" for the baseline
    samples_per_second: float | None  # the job's: sum over ranks of each rank's samples over its own training time
    vs_baseline: float | None  # samples/s over the baseline's (DDP, else allreduce), same conditions
    seconds_to_target: float | None  # first epoch end at which rank 0's replica had the target validation accuracy
    final_accuracy: float | None  # test accuracy of the averaged model, as the example reported it (rank 0)
    bytes_sent_per_step: float | None  # mean over ranks of the worker's bytes sent per step
    mean_staleness: float | None  # mean over ranks: how many steps old the neighbour parameters mixed were
    train_seconds: float | None  # the slowest rank's training time
    steps: int | None  # rank 0's steps


def last(records: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get("kind") == kind), None)


def _trained(end: dict[str, Any]) -> float:
    """Seconds a rank trained: to the end of its last step (closing may wait for slower peers)."""
    return end.get("step_time") or end.get("time") or 0.0


def summarize(label: str, mode: str, ranks: Records, target: float) -> Row:
    """One row from every rank's records: each rank's "close" record (its last record if it never closed)."""
    ends = [last(records, "close") or (records[-1] if records else None) for records in ranks.values()]
    ends = [end for end in ends if end is not None and _trained(end)]
    rank0 = ranks.get(0, [])
    result = last(rank0, "result") or {}
    reached = [r["time"] for r in rank0 if r.get("kind") == "epoch" and (r.get("val_accuracy") or 0.0) >= target]
    rates = [end["samples"] / _trained(end) for end in ends if end.get("samples")]
    per_step = [end["bytes_sent"] / end["step"] for end in ends if end.get("step") and mode != "DDP"]
    staleness = [end["mean_staleness"] for end in ends if end.get("mean_staleness") is not None and mode != "DDP"]
    return Row(
        label=label,
        mode=mode,
        samples_per_second=sum(rates) if rates and len(rates) == len(ends) else None,
        vs_baseline=None,
        seconds_to_target=reached[0] if reached else None,
        final_accuracy=result.get("test_accuracy"),
        bytes_sent_per_step=statistics.fmean(per_step) if per_step else None,
        mean_staleness=statistics.fmean(staleness) if staleness else None,
        train_seconds=max(_trained(end) for end in ends) if ends else None,
        steps=rank0[-1]["step"] if rank0 else None,
    )


def median(rows: Sequence[Row]) -> Row:
    """One row of medians over repeated runs of the same label; a column missing from any run stays None (the
    target counts as reached only if every run reached it)."""
    values = []
    for field in fields(Row):
        column = [getattr(row, field.name) for row in rows]
        if field.name in ("label", "mode"):
            values.append(column[0])
        elif any(value is None for value in column):
            values.append(None)
        else:
            values.append(statistics.median(column))
    return Row(*values)


def compare(rows: Sequence[Row]) -> str | None:
    """Fill ``vs_baseline`` against DDP if it ran, else allreduce; returns the baseline's label."""
    baseline = next((r for r in rows if r.mode == "DDP"), None) or next(
        (r for r in rows if r.label == "allreduce"), None
    )
    if baseline is None or not baseline.samples_per_second:
        return None
    for row in rows:
        if row.samples_per_second is not None:
            row.vs_baseline = row.samples_per_second / baseline.samples_per_second
    return baseline.label


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: Sequence[Row], baseline: str | None, target: float) -> str:
    versus = f"vs {baseline}" if baseline else "vs baseline"
    lines = [
        f"| strategy | mode | samples/s | {versus} | s to {target:.0%} val. accuracy | final test accuracy "
        "| kB sent/step | mean staleness | training s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        kb = None if r.bytes_sent_per_step is None else r.bytes_sent_per_step / 1e3
        to_target = _cell(r.seconds_to_target, 2) if r.seconds_to_target is not None else "not reached"
        lines.append(
            f"| `{r.label}` | {r.mode} | {_cell(r.samples_per_second, 0)} | {_cell(r.vs_baseline, 2)} | {to_target} "
            f"| {_cell(r.final_accuracy, 4)} | {_cell(kb, 1)} | {_cell(r.mean_staleness, 2)} "
            f"| {_cell(r.train_seconds, 2)} |"
        )
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([field.name for field in fields(Row)])
        for row in rows:
            writer.writerow(["" if value is None else value for value in astuple(row)])
