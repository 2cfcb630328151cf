"""``fast topology ring -n 16 [--plot ring.png]``: who talks to whom, the degree, the spectral gap, a drawing."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fast_core.cli.common import CLIError, positive, say
from fast_core.topology import TOPOLOGIES, Topology, is_doubly_stochastic, make_topology, spectral_gap


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "topology",
        help="show a topology's neighbours, degree and spectral gap",
        description="Show a topology: every rank's neighbours and weights, the degree, the spectral gap "
        "1 - |lambda_2(W)| (larger mixes faster), and optionally draw it.",
        epilog=f"topologies: {', '.join(sorted(TOPOLOGIES))}",
    )
    parser.add_argument("name", help="e.g. ring, torus, torus3d, hypercube, exp, exp1, expk, base, complete, star")
    parser.add_argument("-n", "--np", dest="workers", type=positive, required=True, help="number of ranks")
    parser.add_argument("--weights", default="uniform", choices=("uniform", "metropolis"), help="mixing weight rule")
    parser.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="e.g. shape=2x8 (torus), center=3 (star), k=2 (base, expk: peers per rank per step)",
    )
    parser.add_argument("--step", type=int, default=0, help="which step of a time-varying topology (exp1, expk, base)")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="draw the graph of that step into a PNG")
    parser.set_defaults(handler=main)


def options(items: list[str]) -> dict[str, object]:
    parsed: dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise CLIError(f"--option {item!r}: write KEY=VALUE, e.g. shape=2x8")
        parsed[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return parsed


def describe(topology: Topology, step: int) -> str:
    """The text `fast topology` prints."""
    W = topology.mixing_matrix(step)
    degrees = [topology.degree(r, step) for r in range(topology.size)]
    degree = str(degrees[0]) if min(degrees) == max(degrees) else f"{min(degrees)} to {max(degrees)}"
    lines = [
        f"{' '.join([topology.name, *(f'{k}={v}' for k, v in topology.params.items())])}: {topology.size} ranks, "
        f"{'Base-(k+1) construction' if topology.name == 'base' else topology.weights} weights"
        + (f", time-varying with period {topology.period} (step {step} shown)" if topology.is_dynamic else ""),
        f"degree (in-neighbours per rank): {degree}",
        f"spectral gap 1 - |lambda_2(W)|: {topology.spectral_gap(step):.4f}",
    ]
    if topology.is_dynamic:
        product = np.eye(topology.size)
        for k in range(topology.period):
            product = topology.mixing_matrix(k) @ product
        peers = max(topology.degree(r, k) for r in range(topology.size) for k in range(topology.period))
        exact = np.allclose(product, 1.0 / topology.size, rtol=0.0, atol=1e-12)
        lines.append(f"spectral gap of one period W({topology.period - 1})...W(0): {spectral_gap(product):.4f}")
        lines.append(f"exact average after one period ({topology.period} steps): {'yes' if exact else 'no'}")
        lines.append(f"most in-neighbours of a rank in a step of the period: {peers}")
    lines.append(f"W doubly stochastic (exact average preserved): {'yes' if is_doubly_stochastic(W) else 'no'}")
    lines.append("")
    lines.append(f"{'rank':>4}  {'self':>5}  in-neighbours (weight)  ->  out-neighbours")
    for rank in range(topology.size):
        weights = ", ".join(f"{j} ({w:.3g})" for j, w in sorted(topology.in_weights(rank, step).items()))
        outs = ", ".join(map(str, topology.out_neighbors(rank, step)))
        lines.append(f"{rank:>4}  {topology.self_weight(rank, step):>5.3g}  {weights}  ->  {outs}")
    return "\n".join(lines)


def draw(topology: Topology, step: int, path: Path) -> None:
    """The graph of ``step`` as a PNG: grid positions for a 2-D torus, a circle otherwise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    graph = nx.DiGraph(topology.graph(step))
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))
    undirected = topology.is_undirected(step)
    if undirected:
        graph = graph.to_undirected()
    shape = topology.params.get("shape")
    grid = topology.name == "torus2d" and shape is not None
    if grid:
        positions = {r: (r % shape[1], -(r // shape[1])) for r in graph.nodes}
    else:
        positions = nx.circular_layout(graph)
    small = topology.size <= 32
    node_size = 500 if small else 80
    fig, ax = plt.subplots(figsize=(6, 6) if small else (9, 9))
    nx.draw_networkx_nodes(graph, positions, ax=ax, node_color="#4c78a8", node_size=node_size)
    if topology.size <= 64:
        nx.draw_networkx_labels(graph, positions, ax=ax, font_color="white", font_size=9)

    def wraps(edge: tuple[int, int]) -> bool:  # a torus edge that wraps around: drawn as an arc, not across the grid
        (x0, y0), (x1, y1) = positions[edge[0]], positions[edge[1]]
        return grid and abs(x0 - x1) + abs(y0 - y1) > 1

    for bend, edges in ((0.0, [e for e in graph.edges if not wraps(e)]), (0.25, [e for e in graph.edges if wraps(e)])):
        nx.draw_networkx_edges(
            graph,
            positions,
            edgelist=edges,
            ax=ax,
            arrows=True,
            arrowstyle="-" if undirected else "-|>",
            arrowsize=10,
            connectionstyle=f"arc3,rad={bend if undirected else bend + 0.12}",
            edge_color="#555555",
            node_size=node_size,
        )
    title = f"{topology.name}, {topology.size} ranks: spectral gap {topology.spectral_gap(step):.3f}"
    ax.set_title(title + (f" (step {step} of {topology.period})" if topology.is_dynamic else ""))
    ax.set_axis_off()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    topology = make_topology(args.name, args.workers, weights=args.weights, **options(args.option))
    print(describe(topology, args.step))
    if args.plot:
        draw(topology, args.step, args.plot)
        say(f"wrote {args.plot}")
    return 0
