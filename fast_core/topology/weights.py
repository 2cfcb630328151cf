"""Weight rules: edge sets (or given weights, or a whole matrix) turned into one phase of a topology."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from fast_core.topology.base import Edge, Phase
from fast_core.topology.checks import TOL, TopologyError, checked_rule


def both_ways(pairs: Iterable[Edge]) -> set[Edge]:
    """An undirected edge set as directed edges in both directions, without self loops."""
    return {edge for a, b in pairs if a != b for edge in ((a, b), (b, a))}


def _senders(size: int, edges: Iterable[Edge]) -> list[set[int]]:
    senders: list[set[int]] = [set() for _ in range(size)]
    for j, i in edges:
        senders[i].add(j)
    return senders


def weighted_phase(size: int, edges: set[Edge], weights: str) -> Phase:
    """Apply a weight rule to an edge set (self loops must already be removed)."""
    senders = _senders(size, edges)
    if checked_rule(weights) == "uniform":
        rows = [{j: 1.0 / (len(s) + 1) for j in s} for s in senders]
        return Phase(rows, [1.0 / (len(s) + 1) for s in senders])
    for j, i in sorted(edges):
        if (i, j) not in edges:
            raise TopologyError(
                f"metropolis weights need an undirected graph, but rank {j} sends to {i} and {i} does not "
                f"send to {j}; use weights='uniform' or add the reverse edges"
            )
    degrees = [len(s) for s in senders]
    rows = [{j: 1.0 / (1 + max(degrees[i], degrees[j])) for j in s} for i, s in enumerate(senders)]
    return Phase(rows, [1.0 - sum(row.values()) for row in rows])


def explicit_phase(size: int, weighted: dict[Edge, float]) -> Phase:
    """Use given weights W[i, j]; the self weight takes what is left of each row."""
    rows: list[dict[int, float]] = [{} for _ in range(size)]
    for (j, i), weight in sorted(weighted.items()):
        if not math.isfinite(weight) or weight < 0:
            raise TopologyError(f"edge ({j}, {i}) has weight {weight}; mixing weights must be finite and >= 0")
        if weight > 0:
            rows[i][j] = weight
    for i, row in enumerate(rows):
        total = sum(row.values())
        if total > 1.0 + TOL:
            raise TopologyError(
                f"row {i} of the mixing matrix sums to {total:g}; weights into each rank must sum to at most 1"
            )
    return Phase(rows, [max(0.0, 1.0 - sum(row.values())) for row in rows])


def matrix_phase(matrix: np.ndarray) -> Phase:
    """Take a full mixing matrix as given, after checking it is row stochastic and nonnegative."""
    negative = np.argwhere(matrix < 0)
    if len(negative):
        i, j = negative[0]
        raise TopologyError(f"entry [{i}, {j}] of the mixing matrix is {matrix[i, j]:g}; weights must be >= 0")
    sums = matrix.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > TOL)
    if len(bad):
        raise TopologyError(
            f"row {bad[0]} of the mixing matrix sums to {sums[bad[0]]:g}; with weights=None the matrix is W "
            "itself and each row must sum to 1 (or pass weights='uniform' to derive W from the edges)"
        )
    rows = [{int(j): float(matrix[i, j]) for j in np.flatnonzero(matrix[i]) if j != i} for i in range(len(matrix))]
    return Phase(rows, [float(w) for w in np.diag(matrix)])
