"""`fast bench`'s figures, from rank 0's records of each run (matplotlib, Agg backend: no display needed).

loss.png: rank 0's training loss (each record's mean over its steps, then a running mean over 5 records; the epochs'
loss where an example records none per step) against steps and against seconds since the common start.
accuracy.png: validation accuracy of the consensus (averaged) model against seconds since the common start, from
the example's "consensus" records (a run without them: rank 0's own replica at its epoch ends, dashed and named so
in the legend), and each run's job samples/s (all ranks' samples over the job wall-clock), as in the table.
`fast run`'s curves.png: one run's loss and accuracy against seconds, the same curves (``curves``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fast_core.cli.summary import CONSENSUS, Records, Row, accuracy_curve


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float], list[float]]:
    """(steps, seconds, values) of ``key`` over rank 0's records of ``kind``."""
    chosen = [r for r in records if r.get("kind") == kind and r.get(key) is not None]
    return [r["step"] for r in chosen], [r["time"] for r in chosen], [r[key] for r in chosen]


def smooth(values: list[float], window: int = 5) -> list[float]:
    """Running mean over up to ``window`` records ending at each one: rank 0's batch losses are noisy."""
    sums = np.cumsum([0.0, *values])
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / min(i + 1, window) for i in range(len(values))]


def draw_loss(by_step, by_time, ranks: Records, label: str, colour: str) -> None:
    """Rank 0's training loss (running mean) against steps on ``by_step`` (if given) and seconds on ``by_time``."""
    steps, seconds, loss = _series(ranks.get(0, []), "step", "loss")
    if steps:
        loss = smooth(loss)
    else:  # the example records no per-step loss (a Keras callback cannot see it cheaply): its epochs' loss
        steps, seconds, loss = _series(ranks.get(0, []), "epoch", "loss")
    if by_step is not None:
        by_step.plot(steps, loss, label=label, color=colour, linewidth=1.4)
    by_time.plot(seconds, loss, label=label, color=colour, linewidth=1.4)
    by_time.set_xlabel("seconds since the common start")
    for ax in (by_step, by_time):
        if ax is not None:
            ax.set_ylabel("training loss (rank 0, running mean)")
            ax.grid(True, alpha=0.3)


def draw_accuracy(ax, ranks: Records, label: str, colour: str) -> str:
    """The validation accuracy curve of one run (``accuracy_curve``) against seconds; returns the model it is of."""
    curve, model = accuracy_curve(ranks)
    consensus = model == CONSENSUS
    ax.plot(
        [r["time"] for r in curve],
        [r["val_accuracy"] for r in curve],
        marker="o",
        markersize=3,
        label=label if consensus else f"{label} (rank 0's replica)",
        color=colour,
        linewidth=1.4,
        linestyle="-" if consensus else "--",
    )
    return model


def label_accuracy(ax, models: set[str]) -> None:
    """Axis labels saying which model the accuracy curves are of."""
    ax.set_xlabel("seconds since the common start")
    ax.set_ylabel(
        "val. accuracy, consensus model" + ("" if models == {CONSENSUS} else " (dashed: rank 0's replica)")
        if CONSENSUS in models
        else "val. accuracy of rank 0's replica (no consensus records)"
    )
    ax.grid(True, alpha=0.3)


def curves(ranks: Records, out: Path, title: str) -> Path:
    """``fast run``'s figure, curves.png in the run folder ``out``: the loss and the validation accuracy against
    seconds since the common start (either panel empty when the script recorded no such numbers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss, accuracy) = plt.subplots(1, 2, figsize=(11, 4))
    draw_loss(None, loss, ranks, title, "C0")
    label_accuracy(accuracy, {draw_accuracy(accuracy, ranks, title, "C0")})
    fig.suptitle(title)
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot(runs: dict[str, Records], rows: Sequence[Row], out: Path, title: str) -> list[Path]:
    """Write loss.png and accuracy.png into ``out``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {label: f"C{i}" for i, label in enumerate(runs)}
    written = []

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, ranks in runs.items():
        draw_loss(by_step, by_time, ranks, label, colours[label])
    by_step.set_xlabel("step")
    for ax in (by_step, by_time):
        ax.set_yscale("log")
    by_time.legend(title="strategy")
    fig.suptitle(title)
    fig.tight_layout()
    written.append(out / "loss.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, (accuracy, speed) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    models = {draw_accuracy(accuracy, ranks, label, colours[label]) for label, ranks in runs.items()}
    label_accuracy(accuracy, models)
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
