"""`fast bench`'s figures, from rank 0's records of each run (matplotlib, Agg backend: no display needed).

loss.png: rank 0's training loss (each record's mean over its steps, then a running mean over 5 records; the epochs'
loss where an example records none per step) against steps and against seconds since the common start.
accuracy.png: validation accuracy of the consensus (averaged) model against seconds since the common start, from
the example's "consensus" records (a run without them: rank 0's own replica at its epoch ends, dashed and named so
in the legend), and each run's job samples/s (all ranks' samples over the job wall-clock), as in the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .summary import CONSENSUS, Records, Row, accuracy_curve


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float], list[float]]:
    """(steps, seconds, values) of ``key`` over rank 0's records of ``kind``."""
    chosen = [r for r in records if r.get("kind") == kind and r.get(key) is not None]
    return [r["step"] for r in chosen], [r["time"] for r in chosen], [r[key] for r in chosen]


def smooth(values: list[float], window: int = 5) -> list[float]:
    """Running mean over up to ``window`` records ending at each one: rank 0's batch losses are noisy."""
    sums = np.cumsum([0.0, *values])
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


def plot(runs: dict[str, Records], rows: Sequence[Row], out: Path, title: str) -> list[Path]:
    """Write loss.png and accuracy.png into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {label: f"C{i}" for i, label in enumerate(runs)}
    written = []

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, ranks in runs.items():
        steps, seconds, loss = _series(ranks.get(0, []), "step", "loss")
        if steps:
            loss = smooth(loss)
        else:  # the example records no per-step loss (a Keras callback cannot see it cheaply): its epochs' loss
            steps, seconds, loss = _series(ranks.get(0, []), "epoch", "loss")
        by_step.plot(steps, loss, label=label, color=colours[label], linewidth=1.4)
        by_time.plot(seconds, loss, label=label, color=colours[label], linewidth=1.4)
    by_step.set_xlabel("step")
    by_time.set_xlabel("seconds since the common start")
    for ax in (by_step, by_time):
        ax.set_ylabel("training loss (rank 0, running mean)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    by_time.legend(title="strategy")
    fig.suptitle(title)
    fig.tight_layout()
    written.append(out / "loss.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, (accuracy, speed) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    models = set()
    for label, ranks in runs.items():
        curve, model = accuracy_curve(ranks)
        seconds, values, consensus = [r["time"] for r in curve], [r["val_accuracy"] for r in curve], model == CONSENSUS
        models.add(model)
        accuracy.plot(
            seconds,
            values,
            marker="o",
            markersize=3,
            label=label if consensus else f"{label} (rank 0's replica)",
            color=colours[label],
            linewidth=1.4,
            linestyle="-" if consensus else "--",
        )
    accuracy.set_xlabel("seconds since the common start")
    accuracy.set_ylabel(
        "val. accuracy, consensus model" + ("" if models == {CONSENSUS} else " (dashed: rank 0's replica)")
        if CONSENSUS in models
        else "val. accuracy of rank 0's replica (no consensus records)"
    )
    accuracy.grid(True, alpha=0.3)
    accuracy.legend(title="strategy", loc="lower right")
    measured = [r for r in rows if r.job_samples_per_second is not None]
    speed.barh(
        [r.label for r in measured],
        [r.job_samples_per_second for r in measured],
        color=[colours.get(r.label, "C0") for r in measured],
    )
    for index, row in enumerate(measured):
        speed.text(row.job_samples_per_second, index, f" {row.job_samples_per_second:.0f}", va="center", fontsize=9)
    speed.invert_yaxis()
    speed.set_xlabel("job samples/s (all ranks' samples / job wall-clock)")
    speed.margins(x=0.2)
    speed.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    written.append(out / "accuracy.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
