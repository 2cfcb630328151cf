"""A topology over the survivors of a job that lost ranks: the graph heals around the holes.

A torus of 16 that loses one rank has no torus of 15 to become, and renumbering the survivors into a fresh torus
would give every rank new neighbours. Healing keeps every surviving edge and joins, for each lost rank, its
surviving neighbours to each other (in a cycle for an undirected graph, which keeps the degrees small; every
in-neighbour to every out-neighbour for a directed one), so anything that could flow through the lost rank still
flows, and the survivors keep the neighbours they had. The weights follow the topology's rule over the new edges
(uniform or Metropolis-Hastings; explicit weights become uniform). A time-varying topology built by name (the
one-peer exponential graph) is built again for the new size instead: its phases are defined for any size.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from fast_core.topology.base import Edge, Topology
from fast_core.topology.registry import make_topology
from fast_core.topology.weights import weighted_phase


def heal(topology: Topology, kept: Sequence[int]) -> Topology:
    """``topology`` over the ranks ``kept`` (their old numbers, in their new order 0..len(kept)-1)."""
    kept = list(kept)
    if len(set(kept)) != len(kept) or not all(0 <= r < topology.size for r in kept):
        raise ValueError(f"kept ranks {kept} are not distinct ranks of a topology of {topology.size}")
    if topology.is_dynamic:
        return make_topology(topology.name, len(kept), weights=topology.weights, **topology.params)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(topology.size))
    graph.add_edges_from(edge for edge in topology.graph(0).edges if edge[0] != edge[1])
    undirected = topology.is_undirected(0)
    for lost in sorted(set(range(topology.size)) - set(kept)):
        graph.add_edges_from(_bypass(graph, lost, undirected))
        graph.remove_node(lost)
    new_number = {old: new for new, old in enumerate(kept)}
    edges: set[Edge] = {(new_number[a], new_number[b]) for a, b in graph.edges}
    rule = topology.weights if topology.weights in ("uniform", "metropolis") else "uniform"
    return Topology(f"{topology.name} healed", [weighted_phase(len(kept), edges, rule)], weights=rule)


def _bypass(graph: nx.DiGraph, lost: int, undirected: bool) -> list[Edge]:
    """Edges that carry around ``lost`` what used to flow through it."""
    if undirected:
        around = sorted(graph.successors(lost))
        if len(around) < 2:
            return []
        pairs = list(zip(around, around[1:] + around[:1], strict=True)) if len(around) > 2 else [tuple(around)]
        return [edge for a, b in pairs for edge in ((a, b), (b, a))]
    return [(a, b) for a in graph.predecessors(lost) for b in graph.successors(lost) if a != b]
