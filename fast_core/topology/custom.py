"""Topologies from the user's own graph: an edge list, an adjacency matrix or a networkx graph."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import networkx as nx
import numpy as np

from fast_core.topology.base import Edge, Phase, Topology
from fast_core.topology.checks import TopologyError, checked_size, listed
from fast_core.topology.weights import both_ways, explicit_phase, matrix_phase, weighted_phase


def _parsed_edge(edge: Sequence[Any], size: int | None) -> tuple[int, int, float | None]:
    if len(edge) not in (2, 3):
        raise TopologyError(f"edge {edge!r} must be (sender, receiver) or (sender, receiver, weight)")
    try:
        sender, receiver = operator.index(edge[0]), operator.index(edge[1])
        weight = float(edge[2]) if len(edge) == 3 else None
    except (TypeError, ValueError):
        raise TopologyError(f"edge {edge!r} must hold two integer ranks and an optional number") from None
    for rank in (sender, receiver):
        if rank < 0 or (size is not None and rank >= size):
            valid = f"0..{size - 1}" if size is not None else ">= 0"
            raise TopologyError(f"edge {tuple(edge)} names rank {rank}; ranks must be {valid}")
    return sender, receiver, weight


def _explicit_weights(triples: list[tuple[int, int, float]], directed: bool) -> dict[Edge, float]:
    weighted: dict[Edge, float] = {}
    for j, i, weight in triples:
        for edge in [(j, i)] if directed else [(j, i), (i, j)]:
            if weighted.setdefault(edge, weight) != weight:
                raise TopologyError(f"edge {edge} is given twice, with weights {weighted[edge]} and {weight}")
    return weighted


def _check_connected(phase: Phase) -> None:
    """Mixing reaches consensus only if every rank's value can flow to every other rank."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(phase.size))
    graph.add_edges_from(phase.edges)
    if nx.is_strongly_connected(graph):
        return
    everyone = set(range(phase.size))
    if phase.undirected:
        apart = sorted(everyone - nx.descendants(graph, 0) - {0})
        raise TopologyError(
            f"graph is not connected: ranks {listed(apart)} cannot reach rank 0; add edges joining them to the rest"
        )
    cannot_reach = sorted(everyone - nx.ancestors(graph, 0) - {0})
    if cannot_reach:
        raise TopologyError(
            f"graph is not strongly connected: ranks {listed(cannot_reach)} cannot reach rank 0; add edges "
            "from them towards the rest of the graph (or pass directed=False)"
        )
    unreached = sorted(everyone - nx.descendants(graph, 0) - {0})
    raise TopologyError(
        f"graph is not strongly connected: rank 0 cannot reach ranks {listed(unreached)}; add edges "
        "into them from the rest of the graph (or pass directed=False)"
    )


def _custom(phase: Phase, weights: str) -> Topology:
    _check_connected(phase)
    return Topology("custom", [phase], weights=weights)


def from_edges(
    edges: Iterable[tuple[int, int]] | Iterable[tuple[int, int, float]],
    size: int | None = None,
    directed: bool = False,
    weights: str = "uniform",
) -> Topology:
    """A graph from (sender, receiver[, weight]) pairs; a weight is W[receiver, sender] as given.

    Self loops are ignored: the self weight always follows from the rule (or is 1 - the incoming weights).
    """
    parsed = [_parsed_edge(tuple(edge), size) for edge in edges]
    if size is None:
        if not parsed:
            raise TopologyError("no edges and no size given; pass size=N for a graph of N ranks")
        size = max(max(j, i) for j, i, _ in parsed) + 1
    size = checked_size(size)
    parsed = [edge for edge in parsed if edge[0] != edge[1]]
    given = [weight is not None for _, _, weight in parsed]
    if any(given) and not all(given):
        raise TopologyError("some edges have a weight and some do not; give every edge a weight or none")
    if parsed and all(given):
        if weights != "uniform":
            raise TopologyError(f"edges carry explicit weights, so weights={weights!r} cannot apply; drop one")
        triples = [(j, i, w) for j, i, w in parsed if w is not None]
        return _custom(explicit_phase(size, _explicit_weights(triples, directed)), "explicit")
    pairs = [(j, i) for j, i, _ in parsed]
    return _custom(weighted_phase(size, set(pairs) if directed else both_ways(pairs), weights), weights)


def from_adjacency(matrix: np.ndarray | Sequence[Sequence[float]], weights: str | None = "uniform") -> Topology:
    """matrix[i, j] != 0 means j sends to i; weights=None takes the matrix itself as W (with self weights)."""
    try:
        dense = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError):
        raise TopologyError("adjacency matrix must be a square array of numbers") from None
    if dense.ndim != 2 or dense.shape[0] != dense.shape[1] or dense.shape[0] == 0:
        raise TopologyError(
            f"adjacency matrix must be square and non-empty, got shape {dense.shape}; "
            "matrix[i, j] != 0 means rank j sends to rank i"
        )
    if not np.all(np.isfinite(dense)):
        raise TopologyError("adjacency matrix holds NaN or infinite entries")
    if weights is None:
        return _custom(matrix_phase(dense), "explicit")
    receivers, senders = np.nonzero(dense)
    edges = {(int(j), int(i)) for i, j in zip(receivers, senders, strict=True) if i != j}
    return _custom(weighted_phase(len(dense), edges, weights), weights)


def from_networkx(graph: nx.Graph, weights: str = "uniform") -> Topology:
    """Nodes become ranks in sorted order; a DiGraph edge (u, v) means u sends to v, a Graph edge both ways.

    If every edge has a 'weight' attribute, those are the mixing weights W[v, u] (as explicit weights of
    from_edges).
    """
    if not isinstance(graph, nx.Graph):
        raise TopologyError(f"expected a networkx Graph or DiGraph, got {type(graph).__name__}")
    try:
        nodes = sorted(graph.nodes)
    except TypeError:
        raise TopologyError("graph nodes cannot be sorted; relabel them to ranks 0..N-1") from None
    if not nodes:
        raise TopologyError("graph has no nodes; a topology needs at least one rank")
    rank = {node: index for index, node in enumerate(nodes)}
    data = [(rank[u], rank[v], w) for u, v, w in graph.edges(data="weight") if u != v]
    given = [w is not None for _, _, w in data]
    if any(given) and not all(given):
        raise TopologyError("some edges have a 'weight' attribute and some do not; give every edge a weight or none")
    edges = data if data and all(given) else [(j, i) for j, i, _ in data]
    return from_edges(edges, size=len(nodes), directed=graph.is_directed(), weights=weights)
