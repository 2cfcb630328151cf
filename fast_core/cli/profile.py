"""``fast run --profile``'s table: where each rank's time went, read from the close records of the run folder
(fast_core.runtime.time_split writes them), so a user sees which share is training, which is FAST's exchange and
measurement, and which is the machine (a core shared, a thread blocked)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fast_core.cli.summary import last
from fast_core.runtime.time_split import PHASES

PARTS = ("wall", "cpu", "core_wait", "blocked")


def close_records(ranks: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, Mapping[str, Any]]:
    """Each rank's last close record that holds a time split (none for a rank that never closed)."""
    found: dict[int, Mapping[str, Any]] = {}
    for rank, records in ranks.items():
        close = last(list(records), "close")
        if close is not None and close.get("time_wall") is not None:
            found[rank] = close
    return found


def profile_table(closes: Mapping[int, Mapping[str, Any]]) -> str:
    """A Markdown table, one row per rank and phase: seconds on the wall, their share of the rank's wall-clock,
    and how they split into on a core, runnable but waiting for one, and blocked (a peer, the GIL, a sleep). A
    simulated straggler's sleep (``--straggler``) is taken out of the measurement phase, where it happens, into a
    row of its own; the rank's other threads (communication, the budget's grants) get their CPU seconds."""
    lines = [
        "| rank | phase | wall s | share | on a core s | waiting for a core s | blocked s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for rank in sorted(closes):
        record = closes[rank]
        total = float(record["time_wall"]) or 1.0
        slept = float(record.get("straggler_slept") or 0.0)
        for phase in PHASES:
            wall, cpu, core_wait, blocked = (float(record.get(f"time_{phase}_{part}", 0.0)) for part in PARTS)
            if phase == "measurement" and slept:
                wall, blocked = wall - slept, max(blocked - slept, 0.0)
            lines.append(_row(rank, phase, wall, total, f"{cpu:.3f} | {core_wait:.3f} | {blocked:.3f}"))
        if slept:
            lines.append(_row(rank, "straggler's sleep", slept, total, " |  | "))
        other = float(record.get("time_other_threads_cpu", 0.0))
        lines.append(_row(rank, "other threads' CPU", other, total, " |  | "))
    return "\n".join(lines)


def _row(rank: int, phase: str, seconds: float, total: float, rest: str) -> str:
    return f"| {rank} | {phase} | {seconds:.3f} | {seconds / total:.1%} | {rest} |"


def profile_lines(ranks: Mapping[int, Sequence[Mapping[str, Any]]], workers: int) -> list[str]:
    """What ``fast run --profile`` prints after the job, from the ranks' records of this launch: the table, or why
    there is none."""
    closes = close_records(ranks)
    if not closes:
        return [
            "no time split recorded: no rank's FAST worker closed (fast_core.Worker.close, or the adapter's end: "
            "fast_torch.average_model, fast_tf.Callback, fast_jax.average(step=))"
        ]
    lines = [
        "where each rank's time went (--profile; the columns: docs/cli.md#profile):",
        *profile_table(closes).splitlines(),
    ]
    missing = [rank for rank in range(workers) if rank not in closes]
    if missing:
        lines.append(f"rank(s) {missing} recorded no time split: they did not close")
    return lines
