"""Draw docs/architecture.png: FAST's layers, boxes for their key modules, and the two data paths of architecture.md.

Run from the repository root: ``python docs/architecture.py`` (needs matplotlib, a core dependency).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

SYNC, ASYNC, GREY = "#1f77b4", "#e8590c", "#868e96"

# layer name -> (y of the row, [(box label, column), ...]); path 1 runs down columns 0 and 1
STEP = 1.0
LAYERS = {
    "your script": (9 * STEP, [("training loop\nopt.step()", 0), ("fast run\n--strategy S", 4)]),
    "adapters": (
        8 * STEP, [("fast_torch\nDistributedOptimizer", 0), ("fast_tf\nCallback", 2), ("fast_jax\ndistributed", 3)]
    ),
    "cli/": (7 * STEP, [("cli/run.py\nStrategySpec.parse", 4)]),
    "runtime/": (
        6 * STEP,
        [("worker.py\nclock, 2 hooks", 0), ("group.py claims.py\nrecorder.py", 2), ("process.py\ninit()", 3),
         ("builder.py\nwire()", 4)],
    ),
    "observers/": (5 * STEP, [("events.py\nevent records", 2), ("reporting.py\nstraggler.py", 3)]),
    "strategies/": (
        4 * STEP,
        [("dpsgd.py\n(sync)", 0), ("async_avg.py\n(async)", 1), ("base.py\nStepContext", 2),
         ("compose.py\nEvery, Schedule", 3), ("spec.py\nStrategySpec", 4), ("registry.py", 5)],
    ),
    "transport/": (
        3 * STEP, [("mailbox.py", 1), ("comm_thread.py\ndrivers.py", 2), ("service.py\ngossip_boxes.py", 3)]
    ),
    "compression/": (2 * STEP, [("codecs.py\nwire.py", 1), ("feedback.py\nring.py", 2)]),
    "engine/": (
        STEP, [("metered.py", 0), ("mpi.py", 1), ("local.py", 2), ("capabilities.py", 3), ("base.py\nprotocol", 4)]
    ),
    "toolbox": (
        0.0,
        [("model/\nflat, mixing", 0), ("topology/", 1), ("data/", 2), ("grammar/\nspec strings", 3),
         ("config/\nRunConfig", 4), ("config/current.py\nrun_config()", 5)],
    ),
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
    fig, ax = plt.subplots(figsize=(14, 10.5))
    for name, (y, boxes) in LAYERS.items():
        ax.text(-0.15, y + H / 2, name, ha="right", va="center", fontsize=10, weight="bold", color="#343a40")
        for label, column in boxes:
            x = column * COLUMN
            ax.add_patch(FancyBboxPatch((x, y), W, H, boxstyle="round,pad=0.03", fc="#f1f3f5", ec="#495057", lw=1))
            ax.text(x + W / 2, y + H / 2, label, ha="center", va="center", fontsize=8.5, family="monospace")
    # path 1: a torch parameter into a mixing step (D-PSGD), all on the trainer's thread
    arrow(ax, "training loop", "fast_torch", SYNC, "1 step post-hook", at=(0.1, 0.0))
    arrow(ax, "fast_torch", "worker.py", SYNC, "2 worker.after_step()", at=(0.1, 0.0))
    arrow(ax, "worker.py", "dpsgd.py", SYNC, "3 after_step(ctx)", at=(0.1, 0.5))
    arrow(ax, "dpsgd.py", "model/", SYNC, "5 axpy into params(),\n   the tensors' own memory", at=(-0.2, 0.1))
    arrow(ax, "dpsgd.py", "metered.py", SYNC, "4 ctx.engine.wait_all", at=(0.1, 0.9), bend=0.25)
    # an asynchronous step: the trainer only swaps buffers; a thread talks to the engine
    arrow(ax, "worker.py", "async_avg.py", ASYNC, "3 after_step(ctx)", at=(0.3, 0.6))
    arrow(ax, "async_avg.py", "mailbox.py", ASYNC, "4 take / post", at=(0.1, 0.0))
    arrow(ax, "mailbox.py", "comm_thread.py", ASYNC, "5 its thread", at=(-0.3, 0.3))
    # path 2: a strategy string into a running strategy
    arrow(ax, "fast run", "cli/run.py", GREY, "a parse once", at=(0.1, 0.0))
    arrow(ax, "cli/run.py", "config/\nRunConfig", GREY, "b str(spec) in FAST_STRATEGY", at=(0.15, -1.2), bend=-0.15)
    arrow(ax, "config/current.py", "process.py", GREY, "c one read per process", at=(0.55, 0.3), bend=0.2)
    arrow(ax, "builder.py", "spec.py", GREY, "d resolve: parse once, build()", at=(0.1, 0.6))
    arrow(ax, "builder.py", "worker.py", GREY, "e the wired Worker", at=(-1.6, 0.6), bend=0.2)
    ax.text(-1.5, -0.55, "blue: path 1, a torch parameter into a mixing step (D-PSGD), on the trainer's thread.   "
            "orange: an asynchronous step (async averaging); 5 runs on its communication thread.   grey: path 2, a "
            "strategy string into a running strategy.", fontsize=9, color="#343a40")
    ax.set_xlim(-1.6, 5 * COLUMN + W + 0.2)
    ax.set_ylim(-0.75, 9 * STEP + H + 0.2)
    ax.axis("off")
    ax.set_title("FAST: layers (boxes are modules) and two data paths", fontsize=13)
    out = Path(__file__).resolve().parent / "architecture.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
