"""Draw docs/architecture.png: FAST's layers, one box per module, and the path of one training step.

Run from the repository root: ``python docs/architecture.py`` (needs matplotlib, a core dependency).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

SYNC, ASYNC, GREY = "#1f77b4", "#e8590c", "#868e96"

# layer name -> (y of the row, [(box label, column), ...]); the step's path runs down columns 0 and 1
STEP = 1.25
LAYERS = {
    "your script": (6 * STEP, [("training loop\n(examples/)", 0)]),
    "adapters": (5 * STEP, [("fast_torch/\noptimizer.py", 0), ("fast_tf/\ncallback.py", 2), ("fast_jax/\nstep.py", 3)]),
    "worker": (
        4 * STEP,
        [("worker.py", 0), ("observers.py\nreporting, straggler", 2), ("collectives.py", 3),
         ("config.py\nRunConfig", 4), ("cli/\nrun, bench", 5)],
    ),
    "strategies/": (
        3 * STEP,
        [("dpsgd.py\n(sync)", 0), ("async_avg.py\n(async)", 1), ("base.py\nStepContext", 2),
         ("compose.py\nEvery, Schedule", 3), ("spec.py\nstrings", 4)],
    ),
    "transport/": (
        2 * STEP,
        [("mailbox.py", 1), ("comm_thread.py", 2), ("service.py\ngossip_boxes.py", 3), ("framing.py\ntags.py", 4)],
    ),
    "engine/": (STEP, [("metered.py", 1), ("mpi.py", 2), ("local.py", 3), ("base.py\nprotocol", 4)]),
    "toolbox": (0.0, [("topology/", 0), ("flat.py", 1), ("mixing.py", 2), ("contract.py", 3), ("numpy_model.py", 4)]),
}
W, H, COLUMN = 1.9, 0.58, 2.3


def centre(label_start: str) -> tuple[float, float]:
    for y, boxes in LAYERS.values():
        for label, column in boxes:
            if label.startswith(label_start):
                return column * COLUMN + W / 2, y + H / 2
    raise KeyError(label_start)


def arrow(ax, a: str, b: str, colour: str, text: str, at: tuple[float, float] = (0.1, 0.0), bend: float = 0.0) -> None:
    """An arrow from box ``a`` to box ``b``; its label sits ``at`` (dx, dy) from the arrow's middle."""
    (x0, y0), (x1, y1) = centre(a), centre(b)
    dx, dy = x1 - x0, y1 - y0
    t = min(W / 2 / abs(dx) if dx else 1.0, H / 2 / abs(dy) if dy else 1.0)  # from edge to edge of the boxes
    ax.add_patch(
        FancyArrowPatch(
            (x0 + t * dx, y0 + t * dy), (x1 - t * dx, y1 - t * dy), arrowstyle="-|>", mutation_scale=14,
            color=colour, lw=1.8, connectionstyle=f"arc3,rad={bend}", shrinkA=3, shrinkB=3, zorder=3,
        )
    )
    ax.text((x0 + x1) / 2 + at[0], (y0 + y1) / 2 + at[1], text, color=colour, fontsize=8, zorder=4, va="center",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": colour, "lw": 0.8})


def main() -> None:
    fig, ax = plt.subplots(figsize=(13, 8.4))
    for name, (y, boxes) in LAYERS.items():
        ax.text(-0.15, y + H / 2, name, ha="right", va="center", fontsize=10, weight="bold", color="#343a40")
        for label, column in boxes:
            x = column * COLUMN
            ax.add_patch(FancyBboxPatch((x, y), W, H, boxstyle="round,pad=0.03", fc="#f1f3f5", ec="#495057", lw=1))
            ax.text(x + W / 2, y + H / 2, label, ha="center", va="center", fontsize=8.5, family="monospace")
    # a synchronous step (D-PSGD): every arrow runs on the trainer's thread
    arrow(ax, "training loop", "fast_torch", SYNC, "1 opt.step()")
    arrow(ax, "fast_torch", "worker.py", SYNC, "2 worker.after_step()")
    arrow(ax, "worker.py", "dpsgd.py", SYNC, "3 after_step(ctx)", at=(-0.25, 0.0))
    arrow(ax, "dpsgd.py", "metered.py", SYNC, "4 ctx.engine.wait_all:\n   counted", at=(-1.5, 0.0))
    arrow(ax, "metered.py", "mpi.py", SYNC, "5 Isend / Irecv / Testall", at=(-0.8, -0.45))
    # an asynchronous step (async averaging): the trainer only swaps buffers; a thread talks to MPI
    arrow(ax, "worker.py", "async_avg.py", ASYNC, "3 after_step(ctx)", at=(0.2, 0.12))
    arrow(ax, "async_avg.py", "mailbox.py", ASYNC, "4 take / post: never waits")
    arrow(ax, "mailbox.py", "comm_thread.py", ASYNC, "5 its thread polls", at=(-0.45, -0.45))
    arrow(ax, "comm_thread.py", "metered.py", ASYNC, "6 on a dup of the engine", at=(0.75, -0.2))
    # configuration, outside the step
    arrow(ax, "cli/", "config.py", GREY, "environment", at=(-0.5, 0.45))
    arrow(ax, "config.py", "worker.py", GREY, "a resolved strategy, observers", at=(-0.9, 0.55), bend=0.12)
    ax.text(-1.5, -0.55, "blue: a synchronous step (D-PSGD), all on the trainer's thread.   orange: an asynchronous "
            "step (async averaging); 5-6 run on the strategy's communication thread.   grey: the run configuration.",
            fontsize=9, color="#343a40")
    ax.set_xlim(-1.6, 5 * COLUMN + W + 0.2)
    ax.set_ylim(-0.75, 6 * STEP + H + 0.2)
    ax.axis("off")
    ax.set_title("FAST: layers (one box per module) and the path of one step", fontsize=13)
    out = Path(__file__).resolve().parent / "architecture.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
