"""What the dashboard shows, computed from the run folder's records alone: each rank's state and latest numbers, the
job's budget and ETA, the alerts a user should see first. Numbers are the records' own values; the text cells are
those values printed, so the page and the files agree to the last digit shown.

When a rank counts as slow or silent (the thresholds below) is a judgement; they are named here, once.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fast_core.cli.dashboard.follow import RunFolder
from fast_core.cli.summary import accuracy_curve, job_wall_clock

SLOW = 0.5
"""A running rank whose own pace (steps per second not spent waiting for peers) is below this fraction of the median
rank's is marked slow."""
SILENT_SECONDS = 3.0
"""A live rank whose file has not grown for this many seconds longer than the freshest rank's is marked silent (lost,
hung or far behind); at least ``SILENT_INTERVALS`` of its own intervals between records, so a slow log is no alarm."""
SILENT_INTERVALS = 4
RATE_RECORDS = 3
"""A rank's step rate is taken over its last this many "step" records: recent enough to show a slow-down at once."""


@dataclass
class RankView:
    """One rank's row: its state, its latest values (as recorded) and those values printed."""

    rank: int
    state: str
    replaced: bool
    speed: float | None
    """Its own pace over the median rank's: the colour it is drawn in."""
    values: dict[str, Any]
    cells: dict[str, str]
    note: str = ""


@dataclass
class View:
    """The whole page's numbers at one moment (``build``), served as JSON."""

    run_dir: str
    title: str
    live: bool
    status: str
    ranks: list[RankView]
    alerts: list[str]
    budget: dict[str, Any] | None
    consensus: dict[str, Any]
    skipped: dict[int, int]
    records: int
    version: int = 0
    read_at: float = field(default_factory=time.time)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped"] = {str(rank): count for rank, count in self.skipped.items()}
        data["skipped_total"] = sum(self.skipped.values())
        return data


def current(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the rank's latest process: a replacement (``--max-restarts``) starts with its own "start"."""
    starts = [i for i, r in enumerate(records) if r.get("kind") == "start"]
    return records[starts[-1] :] if starts else records


def step_rate(records: list[dict[str, Any]], own: bool = False) -> float | None:
    """Steps per second over the last ``RATE_RECORDS`` "step" records of the rank's latest process; ``own``: per
    second not spent waiting for peers (``wait_seconds``), the rank's own pace, which tells the straggler from the
    ranks that wait for it under a synchronous strategy, where every rank steps at the same rate."""
    steps = [r for r in current(records) if r.get("kind") == "step"][-RATE_RECORDS:]
    if len(steps) < 2:
        return None
    seconds = steps[-1]["time"] - steps[0]["time"]
    if own:
        seconds -= (steps[-1].get("wait_seconds") or 0.0) - (steps[0].get("wait_seconds") or 0.0)
    return (steps[-1]["step"] - steps[0]["step"]) / seconds if seconds > 0 else None


def recorded_rate(records: list[dict[str, Any]]) -> float | None:
    """The rank's step rate as its newest "step" record says it (``steps_per_second``, since the record before),
    so page and file agree; computed over the last records where the writer predates that field."""
    steps = [r for r in current(records) if r.get("kind") == "step"]
    if steps and steps[-1].get("steps_per_second") is not None:
        return steps[-1]["steps_per_second"]
    return step_rate(records)


def record_interval(records: list[dict[str, Any]]) -> float | None:
    """Mean seconds between the rank's "step" records so far (how often it is heard from)."""
    times = [r["time"] for r in current(records) if r.get("kind") == "step"]
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def latest(records: list[dict[str, Any]], key: str) -> Any:
    """The newest value of ``key`` the rank recorded (None if it never did)."""
    return next((r[key] for r in reversed(records) if r.get(key) is not None), None)


def distance_series(records: dict[int, list[dict[str, Any]]]) -> list[tuple[float, float]]:
    """(seconds, consensus distance) from the lowest rank's step and epoch records, once per new value: the script
    computes it now and then, every record repeats the last (and records written after training, none of it)."""
    first = records.get(min(records, default=0), [])
    points: list[tuple[float, float]] = []
    for r in first:
        value = r.get("consensus_distance")
        if r.get("kind") in ("step", "epoch") and value is not None and (not points or points[-1][1] != value):
            points.append((r["time"], value))
    return points


def cells(values: dict[str, Any]) -> dict[str, str]:
    """The row's values as the page prints them ("-" where none was recorded)."""
    formats = {
        "step": "{:d}",
        "steps_per_second": "{:.3g}",
        "own_steps_per_second": "{:.3g}",
        "samples": "{:.0f}",
        "mean_staleness": "{:.2f}",
        "bytes_sent": "{:.2f}",
        "wait_seconds": "{:.2f}",
        "consensus_distance": "{:.3g}",
    }
    shown = {}
    for key, form in formats.items():
        value = values.get(key)
        if key == "bytes_sent" and value is not None:
            value = value / 1e6  # printed in MB
        shown[key] = "-" if value is None else form.format(value)
    return shown


def _lost(folder: RunFolder) -> dict[int, str]:
    """Ranks lost and not taken over since: the guards' bad endings after the rank's last start, and the ranks a
    recovery counted lost without a replacement."""
    lost: dict[int, str] = {}
    for ending in folder.exits:
        rank = ending.get("rank")
        start = (current(folder.ranks[rank].records)[:1] or [{}])[0] if rank in folder.ranks else {}
        if rank is not None and ending.get("wall", 0) >= start.get("wall_start", 0):
            how = f"killed by {ending['signal']}" if ending.get("signal") else f"exit status {ending.get('status')}"
            lost[int(rank)] = how
    for state in folder.ranks.values():
        for record in state.records:
            if record.get("kind") == "membership":
                replaced = {int(r) for r in str(record.get("replaced") or "").split(",") if r}
                for rank in (int(r) for r in str(record.get("lost") or "").split(",") if r):
                    if rank not in replaced:
                        lost.setdefault(rank, f"lost at step {record.get('step')}")
    return lost


def _rank(folder: RunFolder, rank: int, live: bool, lost: dict[int, str], freshest: float) -> RankView:
    records = folder.ranks[rank].records
    mine = current(records)
    kinds = {r.get("kind") for r in mine}
    values = {
        "step": latest(mine, "step"),
        "steps_per_second": recorded_rate(records),
        "own_steps_per_second": step_rate(records, own=True),
        "samples": folder.ranks[rank].samples.samples if any("samples" in r for r in records) else None,
        "mean_staleness": latest(mine, "mean_staleness"),
        "bytes_sent": latest(mine, "bytes_sent"),
        "wait_seconds": latest(mine, "wait_seconds"),
        "consensus_distance": latest(mine, "consensus_distance"),
    }
    errors = [e for e in folder.errors if e.get("rank") == rank]
    silence = freshest - folder.ranks[rank].changed
    interval = record_interval(records) or 0.0
    note = ""
    if rank in lost:
        state, note = "lost", lost[rank]
    elif errors:
        state, note = "error", f"{errors[0].get('error', 'error')}"
    elif "close" in kinds:
        state = "closed"
    elif not live:
        state, note = "stopped", "the job ended before this rank closed"
    elif live and silence > max(SILENT_SECONDS, SILENT_INTERVALS * interval):
        state, note = "silent", f"no record for {silence:.0f} s"
    elif "step" not in kinds:
        state = "starting"
    else:
        state = "running"
    replaced = sum(r.get("kind") == "start" for r in records) > 1
    return RankView(rank, state, replaced, None, values, cells(values), note)


def _speeds(ranks: list[RankView]) -> None:
    """Each rank's own pace over the median rank's; a running rank below ``SLOW`` of it is slow."""
    paces = [r.values["own_steps_per_second"] for r in ranks if r.values["own_steps_per_second"]]
    if not paces:
        return
    median = statistics.median(paces)
    for row in ranks:
        pace = row.values["own_steps_per_second"]
        if pace is not None and median > 0:
            row.speed = pace / median
            if row.state == "running" and row.speed < SLOW:
                row.state, row.note = "slow", f"{row.speed:.2f}x the median rank's pace"


def _budget(folder: RunFolder, live: bool, elapsed: float | None) -> dict[str, Any] | None:
    """The shared work budget's progress and ETA (rank 0's "start" record names it; else run.json)."""
    start = next((s.samples.start for s in folder.ranks.values() if s.samples.start), None) or {}
    samples = start.get("budget_samples", folder.run.get("budget_samples"))
    seconds = start.get("budget_seconds", folder.run.get("budget_seconds"))
    if samples is None and seconds is None:
        return None
    done = sum(state.samples.samples for state in folder.ranks.values())
    parts, fraction, eta = [], 0.0, None
    if samples:
        fraction = done / samples
        parts.append(f"{done:.0f} of {samples} samples")
        if live and elapsed and done:
            eta = (samples - done) / (done / elapsed)
    if seconds and elapsed is not None:
        fraction = max(fraction, elapsed / seconds)
        parts.append(f"{elapsed:.0f} of {seconds:g} s")
        eta = min(eta, seconds - elapsed) if eta is not None else seconds - elapsed
    fraction = min(1.0, fraction)
    eta_text = "done" if not live else ("-" if eta is None else f"{max(0.0, eta):.0f} s")
    return {"fraction": fraction, "done": done, "text": ", ".join(parts), "eta": eta, "eta_text": eta_text}


def build(folder: RunFolder, now: float | None = None) -> View:
    """The view of ``folder`` as last refreshed, at ``now`` (``time.time()``)."""
    now = time.time() if now is None else now
    records = folder.records
    states = [current(r) for r in records.values()]
    ended = "exit_status" in folder.run
    all_closed = bool(states) and all(any(r.get("kind") == "close" for r in s) for s in states)
    live = not ended and not all_closed
    lost = _lost(folder)
    freshest = max((s.changed for s in folder.ranks.values()), default=now)
    ranks = [_rank(folder, rank, live, lost, freshest) for rank in folder.ranks]
    _speeds(ranks)
    starts = [s[0]["wall_start"] for s in states if s and s[0].get("wall_start") is not None]
    elapsed = (now - min(starts) if starts else None) if live else job_wall_clock(records)
    alerts = [f"rank {r.rank} {r.state}: {r.note}" for r in ranks if r.state in ("slow", "silent", "lost", "error")]
    alerts += [f"rank {r.rank}: a new process took over" for r in ranks if r.replaced]
    quiet = now - freshest
    if live and ranks and quiet > SILENT_SECONDS and not any(r.state == "silent" for r in ranks):
        alerts.append(f"no rank has written a record for {quiet:.0f} s: the job is stalled or between records")
    if folder.skipped:
        alerts.append(f"{sum(folder.skipped.values())} malformed record line(s) skipped (a job killed mid-write?)")
    curve, model = accuracy_curve(records)
    distance = distance_series(records)
    strategy = folder.run.get("strategy") or (states[0][0].get("strategy") if states and states[0] else None)
    return View(
        run_dir=str(folder.path),
        title=f"{strategy or 'the script strategy'}, {len(ranks)} ranks",
        live=live,
        status=_status(folder, live, quiet, elapsed),
        ranks=ranks,
        alerts=alerts,
        budget=_budget(folder, live, elapsed),
        consensus={
            "distance": distance[-1][1] if distance else None,
            "accuracy": curve[-1]["val_accuracy"] if curve else None,
            "model": model,
        },
        skipped=folder.skipped,
        records=sum(len(r) for r in records.values()),
        read_at=now,
    )


def _status(folder: RunFolder, live: bool, quiet: float, elapsed: float | None) -> str:
    """One line on the job as a whole."""
    took = "" if elapsed is None else f" after {elapsed:.1f} s"
    if live and not folder.ranks:
        return "waiting for the ranks' first records"
    if live:
        return f"running{took}; last record {max(0.0, quiet):.1f} s ago"
    status = folder.run.get("exit_status")
    if status not in (None, 0):
        cause = (folder.run.get("error") or {}).get("error")
        return f"ended with exit status {status}{took}" + (f": {cause}" if cause else "")
    return f"finished{took}"
