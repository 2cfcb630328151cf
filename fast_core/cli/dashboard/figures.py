"""The dashboard's three pictures, drawn on the server by matplotlib as SVG (no script library in the page, nothing
fetched): the topology with each rank coloured by its speed, the ranks' numbers over time, the consensus model's.

Only matplotlib's object API (``Figure``), never pyplot: the server draws from its request threads.
"""

from __future__ import annotations

import io
import re
from typing import Any

import networkx as nx

from fast_core.cli.dashboard.view import View, current, distance_series
from fast_core.cli.summary import CONSENSUS, Records, accuracy_curve
from fast_core.errors import ConfigError
from fast_core.strategies.spec import StrategySpec
from fast_core.topology import make_topology

MAX_POINTS = 400
"""Points per line at most (a long run is thinned evenly): the SVG stays small and quick to draw."""
SPEED_RANGE = (0.25, 1.25)
"""Step rate over the median's, from red to green."""
RING = {"silent": "#d62728", "lost": "black", "error": "black", "closed": "#7f7f7f", "stopped": "#7f7f7f"}
"""The outline of a rank in these states (a replaced rank's is blue)."""


def _svg(fig: Any) -> bytes:
    import matplotlib

    out = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "fast"}):  # text as text: small, stable
        fig.savefig(out, format="svg")
    return out.getvalue()


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def neighbour_graph(run: dict[str, Any], start: dict[str, Any], size: int) -> nx.Graph | None:
    """The job's neighbour graph: run.json's strategy and topology (as ``fast run`` got them), else the topology the
    first "start" record's strategy names; None for a strategy without one (all-reduce)."""
    name = run.get("topology")
    try:
        if run.get("strategy"):
            name = StrategySpec.parse(run["strategy"]).with_run_topology(name).topology
    except ConfigError:
        name = None
    if name is None:
        found = re.search(r"topology='([^']+)'", str(start.get("strategy", "")))
        name = found.group(1) if found else None
    if not isinstance(name, str) or size < 1:
        return None
    try:
        return make_topology(name, size).graph().to_undirected()
    except (ConfigError, ValueError):
        return None


def topology(view: View, run: dict[str, Any], start: dict[str, Any]) -> bytes:
    """The ranks on a circle, joined as the strategy's topology joins them, filled by speed, ringed by state."""
    import matplotlib
    from matplotlib.collections import LineCollection

    size = len(view.ranks)
    graph = neighbour_graph(run, start, max(size, 1))
    pos = nx.circular_layout(range(max(size, 1)))
    fig = _figure(4.6, 4.1)
    ax = fig.add_subplot()
    if graph is not None:
        lines = [(pos[a], pos[b]) for a, b in graph.edges if a != b and a in pos and b in pos]
        ax.add_collection(LineCollection(lines, colors="#999999", linewidths=0.8, zorder=1))
    cmap = matplotlib.colormaps["RdYlGn"]
    norm = matplotlib.colors.Normalize(*SPEED_RANGE)
    big = size <= 32
    xy = [pos.get(row.rank, (0.0, 0.0)) for row in view.ranks]
    fills, rings, widths = [], [], []
    for row in view.ranks:
        fills.append("#dddddd" if row.state in ("lost", "error") or row.speed is None else cmap(norm(row.speed)))
        rings.append("#1f77b4" if row.replaced and row.state not in RING else RING.get(row.state, "#333333"))
        widths.append(3.0 if row.state in RING or row.replaced else 0.8)
    if xy:
        x, y = zip(*xy, strict=True)
        ax.scatter(x, y, s=420 if big else 120, c=fills, edgecolors=rings, linewidths=widths, zorder=2)
    gone = [point for point, row in zip(xy, view.ranks, strict=True) if row.state in ("lost", "error")]
    if gone:
        ax.scatter(*zip(*gone, strict=True), s=220 if big else 80, c="black", marker="x", linewidths=2.5, zorder=3)
    for (x, y), row in zip(xy, view.ranks, strict=True) if big else ():
        ax.text(x, y, str(row.rank), ha="center", va="center", fontsize=8, zorder=4)
    mapper = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(mapper, ax=ax, shrink=0.7, label="own pace / median rank's")
    what = "no neighbour graph (every rank with every rank)" if graph is None else "lines: neighbours"
    ax.set_title(f"{what}\nring: red silent, black x lost, blue replaced, grey ended", fontsize=8)
    ax.set_aspect("equal")
    ax.margins(0.12)
    ax.axis("off")
    return _svg(fig)


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, -(-len(points) // MAX_POINTS))
    return points[::step] if points[-1:] == points[::step][-1:] else [*points[::step], points[-1]]


def rank_series(records: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """(seconds since the common start, value) of one rank: its step rate between step records (as each record
    says it, where it does), its mean staleness and its MB sent."""
    steps = [r for r in current(records) if r.get("kind") == "step"]
    rate = [
        (b["time"], b["steps_per_second"])
        if b.get("steps_per_second") is not None
        else (b["time"], (b["step"] - a["step"]) / (b["time"] - a["time"]))
        for a, b in zip(steps, steps[1:], strict=False)
        if b["time"] > a["time"]
    ]
    staleness = [(r["time"], r["mean_staleness"]) for r in steps if r.get("mean_staleness") is not None]
    sent = [(r["time"], r["bytes_sent"] / 1e6) for r in steps if r.get("bytes_sent") is not None]
    return {"rate": rate, "staleness": staleness, "sent": sent}


def ranks(view: View, records: Records) -> bytes:
    """Step rate, staleness and MB sent of every rank over time; slow, silent and lost ranks in red."""
    import matplotlib

    fig = _figure(12, 3.4)
    axes = fig.subplots(1, 3)
    titles = ("steps/s", "mean staleness (steps)", "MB sent")
    cmap = matplotlib.colormaps["viridis"]
    flagged = {r.rank for r in view.ranks if r.state in ("slow", "silent", "lost", "error")}
    count = max(1, len(records) - 1)
    for rank, recorded in records.items():
        series = rank_series(recorded)
        for ax, key in zip(axes, ("rate", "staleness", "sent"), strict=True):
            points = series[key]
            if not points:
                continue
            x, y = zip(*_thin(points), strict=True)
            red = rank in flagged
            ax.plot(
                x,
                y,
                color="#d62728" if red else cmap(rank / count),
                linewidth=2.0 if red else 0.9,
                alpha=1.0 if red or len(records) <= 8 else 0.6,
                label=f"rank {rank}",
                zorder=3 if red else 2,
            )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds since the common start")
        ax.grid(True, alpha=0.3)
    if 0 < len(records) <= 8 and axes[0].lines:
        axes[0].legend(fontsize=7)
    return _svg(fig)


def consensus(view: View, records: Records) -> bytes:
    """The consensus distance and the consensus model's validation accuracy over time."""
    fig = _figure(12, 3.2)
    distance_ax, accuracy_ax = fig.subplots(1, 2)
    distance = distance_series(records)
    if distance:
        x, y = zip(*_thin(distance), strict=True)
        distance_ax.plot(x, y, marker=".", color="C0")
        if min(y) > 0 and max(y) > 10 * min(y):  # a log axis only where it spans a decade
            distance_ax.set_yscale("log")
    distance_ax.set_title("consensus distance (as the script last computed it)", fontsize=10)
    curve, model = accuracy_curve(records)
    if curve:
        accuracy_ax.plot([r["time"] for r in curve], [r["val_accuracy"] for r in curve], marker=".", color="C2")
    which = "consensus model" if model == CONSENSUS else "rank 0's replica (no consensus records)"
    accuracy_ax.set_title(f"validation accuracy, {which}", fontsize=10)
    for ax in (distance_ax, accuracy_ax):
        ax.set_xlabel("seconds since the common start")
        ax.grid(True, alpha=0.3)
    return _svg(fig)
