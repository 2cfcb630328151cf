"""`fast bench`'s table: one row per run, computed from the run's per-rank records (fast_core.observers.runlog).

The figures describe the job a user waits for (fast_core.observers.reporting says where each time comes from): its
wall-clock runs from the earliest rank's start (the worker's start is collective: the common start) to the last
rank's stop (the end of its last step), and its samples/s divides all ranks' samples by that wall-clock. Each
rank's own rate (its samples over its own training time) is kept apart, named per-rank: a sum of those is no
throughput any clock sees. Time to target and final accuracy are those of the consensus (averaged) model.
The start and stop are each rank's ``time.time()``: across hosts the wall-clock assumes their clocks agree (NTP).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

Records = dict[int, list[dict[str, Any]]]

CONSENSUS = "consensus"
"""The kind of the records an example writes (on rank 0) for the consensus model: ``time`` (seconds since the
common start) and ``val_accuracy`` (of the average of all ranks' models at that time)."""
RANK0 = "rank 0"
"""Where time to target is read when a run wrote no consensus records: rank 0's own replica at its epoch ends."""
FALLBACK_MARK = "*"


@dataclass
class Row:
    """What one run measured. None: not recorded (the example does not report it, or the run failed)."""

    label: str
    mode: str  # sync, async, or "DDP" for the baseline
    job_seconds: float | None  # wall-clock from the earliest rank's start to the last rank's end of its last step
    job_samples: float | None  # samples trained, summed over all ranks
    job_samples_per_second: float | None  # job_samples / job_seconds
    vs_baseline: float | None  # job samples/s over the baseline's (DDP, else allreduce), same conditions
    per_rank_samples_per_second: float | None  # mean over ranks of each rank's samples over its own training time
    seconds_to_target: float | None  # since the common start, first evaluation reaching the target (see target_model)
    target_model: str  # CONSENSUS: the averaged model's evaluations; RANK0: rank 0's replica (no consensus records)
    final_accuracy: float | None  # test accuracy of the averaged model, as the example reported it (rank 0)
    bytes_sent_per_step: float | None  # mean over ranks of the worker's bytes sent per step
    mean_staleness: float | None  # mean over ranks: how many steps old the neighbour parameters mixed were
    steps: int | None  # rank 0's steps


TEXT_FIELDS = ("label", "mode", "target_model")


def last(records: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get("kind") == kind), None)


def _trained(end: dict[str, Any]) -> float:
    """Seconds a rank trained: to the end of its last step (closing may wait for slower peers)."""
    return end.get("step_time") or end.get("time") or 0.0


def job_wall_clock(ranks: Records) -> float | None:
    """Seconds from the earliest "start" record's ``wall_start`` to the latest "close" record's ``wall_stop``; None
    unless every rank recorded both."""
    starts = [(last(records, "start") or {}).get("wall_start") for records in ranks.values()]
    stops = [(last(records, "close") or {}).get("wall_stop") for records in ranks.values()]
    if not ranks or None in starts or None in stops:
        return None
    return max(stops) - min(starts)


def accuracy_curve(ranks: Records) -> tuple[list[dict[str, Any]], str]:
    """(records with ``time`` and ``val_accuracy``, in time order; the model they evaluate): the consensus model's
    records when the run wrote any (any rank; the examples write them on rank 0), else rank 0's own epoch ends."""
    consensus = [
        r
        for records in ranks.values()
        for r in records
        if r.get("kind") == CONSENSUS and r.get("time") is not None and r.get("val_accuracy") is not None
    ]
    if consensus:
        return sorted(consensus, key=lambda r: r["time"]), CONSENSUS
    epochs = [r for r in ranks.get(0, []) if r.get("kind") == "epoch" and r.get("val_accuracy") is not None]
    return epochs, RANK0


def time_to_target(ranks: Records, target: float) -> tuple[float | None, str]:
    """(seconds since the common start, model) of the first evaluation on ``accuracy_curve`` at ``target``
    validation accuracy or more; None: never reached."""
    curve, model = accuracy_curve(ranks)
    reached = [r["time"] for r in curve if r["val_accuracy"] >= target]
    return (reached[0] if reached else None), model


def summarize(label: str, mode: str, ranks: Records, target: float) -> Row:
    """One row from every rank's records: each rank's "start" and "close" records (its last record if it never
    closed), rank 0's "result", and the consensus (else rank 0's epoch) records for time to target."""
    ends = [last(records, "close") or (records[-1] if records else None) for records in ranks.values()]
    ends = [end for end in ends if end is not None and _trained(end)]
    rank0 = ranks.get(0, [])
    result = last(rank0, "result") or {}
    counted = [end["samples"] for end in ends if end.get("samples") is not None]
    every_rank = bool(ends) and len(ends) == len(ranks) and len(counted) == len(ends)
    job_samples = float(sum(counted)) if every_rank else None
    seconds = job_wall_clock(ranks)
    rates = [end["samples"] / _trained(end) for end in ends if end.get("samples")]
    per_step = [end["bytes_sent"] / end["step"] for end in ends if end.get("step") and mode != "DDP"]
    staleness = [end["mean_staleness"] for end in ends if end.get("mean_staleness") is not None and mode != "DDP"]
    reached, model = time_to_target(ranks, target)
    return Row(
        label=label,
        mode=mode,
        job_seconds=seconds,
        job_samples=job_samples,
        job_samples_per_second=job_samples / seconds if job_samples is not None and seconds else None,
        vs_baseline=None,
        per_rank_samples_per_second=statistics.fmean(rates) if every_rank and len(rates) == len(ends) else None,
        seconds_to_target=reached,
        target_model=model,
        final_accuracy=result.get("test_accuracy"),
        bytes_sent_per_step=statistics.fmean(per_step) if per_step else None,
        mean_staleness=statistics.fmean(staleness) if staleness else None,
        steps=(last(rank0, "close") or (rank0[-1] if rank0 else {})).get("step"),
    )


def median(rows: Sequence[Row]) -> Row:
    """One row of medians over repeated runs of the same label; a column missing from any run stays None (the
    target counts as reached only if every run reached it); a text column differing between runs says "mixed"."""
    values = []
    for field in fields(Row):
        column = [getattr(row, field.name) for row in rows]
        if field.name in TEXT_FIELDS:
            values.append(column[0] if len(set(column)) == 1 else "mixed")
        elif any(value is None for value in column):
            values.append(None)
        else:
            values.append(statistics.median(column))
    return Row(*values)


def compare(rows: Sequence[Row]) -> str | None:
    """Fill ``vs_baseline`` (job samples/s) against DDP if it ran, else allreduce; returns the baseline's label."""
    baseline = next((r for r in rows if r.mode == "DDP"), None) or next(
        (r for r in rows if r.label == "allreduce"), None
    )
    if baseline is None or not baseline.job_samples_per_second:
        return None
    for row in rows:
        if row.job_samples_per_second is not None:
            row.vs_baseline = row.job_samples_per_second / baseline.job_samples_per_second
    return baseline.label


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: Sequence[Row], baseline: str | None, target: float) -> str:
    """The table, and a footnote under it when a run's time to target is not the consensus model's."""
    versus = f"vs {baseline}" if baseline else "vs baseline"
    fallback = [r for r in rows if r.target_model != CONSENSUS]
    model = "rank 0's replica" if len(fallback) == len(rows) else "consensus model"
    lines = [
        f"| strategy | mode | job wall-clock s | job samples/s | {versus} | per-rank samples/s (mean) "
        f"| s to {target:.0%} val. accuracy ({model}) | final test accuracy (consensus model) | kB sent/step "
        "| mean staleness |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        kb = None if r.bytes_sent_per_step is None else r.bytes_sent_per_step / 1e3
        to_target = _cell(r.seconds_to_target, 2) if r.seconds_to_target is not None else "not reached"
        if r.target_model != CONSENSUS:
            to_target += FALLBACK_MARK
        lines.append(
            f"| `{r.label}` | {r.mode} | {_cell(r.job_seconds, 2)} | {_cell(r.job_samples_per_second, 0)} "
            f"| {_cell(r.vs_baseline, 2)} | {_cell(r.per_rank_samples_per_second, 0)} | {to_target} "
            f"| {_cell(r.final_accuracy, 4)} | {_cell(kb, 1)} | {_cell(r.mean_staleness, 2)} |"
        )
    if fallback:
        lines.append(
            f'\n\\{FALLBACK_MARK} not the consensus model: no "{CONSENSUS}" records in the run of '
            f"{', '.join(f'`{r.label}`' for r in fallback)}, so the time to target shown is rank 0's own replica's, "
            "at its epoch ends."
        )
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([field.name for field in fields(Row)])
        for row in rows:
            writer.writerow(["" if value is None else value for value in astuple(row)])
