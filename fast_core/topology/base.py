"""The Topology class: one sparse graph per phase of a (possibly time-varying) topology, and its queries."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np

from fast_core.topology.checks import checked_rank
from fast_core.topology.matrix import spectral_gap

Edge = tuple[int, int]  # (sender, receiver)


class Phase:
    """One graph of a topology, stored sparsely; the dense and derived views are built on first use."""

    def __init__(self, in_weights: list[dict[int, float]], self_weights: list[float]) -> None:
        self.size = len(self_weights)
        self.in_weights = [dict(sorted(row.items())) for row in in_weights]
        self.self_weights = self_weights

    @cached_property
    def in_neighbors(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(row) for row in self.in_weights)

    @cached_property
    def out_neighbors(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(self.size)]
        for receiver, row in enumerate(self.in_weights):
            for sender in row:
                out[sender].append(receiver)
        return tuple(tuple(sorted(targets)) for targets in out)

    @cached_property
    def edges(self) -> frozenset[Edge]:
        return frozenset((j, i) for i, row in enumerate(self.in_weights) for j in row)

    @cached_property
    def undirected(self) -> bool:
        return all((i, j) in self.edges for j, i in self.edges)

    @cached_property
    def matrix(self) -> np.ndarray:
        """Dense W, read-only because it is shared by every caller of this step."""
        matrix = np.diag(np.asarray(self.self_weights, dtype=np.float64))
        for i, row in enumerate(self.in_weights):
            for j, weight in row.items():
                matrix[i, j] = weight
        matrix.flags.writeable = False
        return matrix

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Frozen, so a caller cannot change the cached graph under other callers."""
        graph = nx.DiGraph()
        graph.add_nodes_from(range(self.size))
        graph.add_weighted_edges_from((j, i, w) for i, row in enumerate(self.in_weights) for j, w in row.items())
        graph.add_weighted_edges_from((i, i, w) for i, w in enumerate(self.self_weights) if w > 0)
        return nx.freeze(graph)

    @cached_property
    def gap(self) -> float:
        return spectral_gap(self.matrix)


class Topology:
    """A (possibly time-varying) directed graph over `size` ranks with mixing weights.

    Build one with the functions of fast_core.topology (ring, torus_2d, from_edges, make_topology, ...). Each step's
    graph is computed once; queries after that are dictionary look-ups, cheap enough for every training step.
    """

    def __init__(self, name: str, phases: Sequence[Phase], weights: str = "uniform", **params: Any) -> None:
        self.name = name
        self.size = phases[0].size
        self.period = len(phases)
        self.weights = weights
        self.params = params
        self._phases = {k: phase for k, phase in enumerate(phases)}
        for key, value in params.items():
            setattr(self, key, value)

    @property
    def is_dynamic(self) -> bool:
        return self.period > 1

    def __repr__(self) -> str:
        parts = [repr(self.name), f"size={self.size}"] + [f"{k}={v!r}" for k, v in self.params.items()]
        if self.weights != "uniform":
            parts.append(f"weights={self.weights!r}")
        return f"Topology({', '.join(parts)})"

    def _phase(self, step: int) -> Phase:
        return self._phases[operator.index(step) % self.period]

    def _rank(self, rank: int) -> int:
        return checked_rank(rank, self.size, "rank")

    def graph(self, step: int = 0) -> nx.DiGraph:
        """Nodes 0..N-1, edges sender -> receiver with attribute 'weight'; self loops hold the self weight."""
        return self._phase(step).graph

    def in_neighbors(self, rank: int, step: int = 0) -> list[int]:
        """Ranks that send to `rank` at `step`, sorted, without `rank` itself."""
        return list(self._phase(step).in_neighbors[self._rank(rank)])

    def out_neighbors(self, rank: int, step: int = 0) -> list[int]:
        """Ranks that `rank` sends to at `step`, sorted, without `rank` itself."""
        return list(self._phase(step).out_neighbors[self._rank(rank)])

    def in_weights(self, rank: int, step: int = 0) -> dict[int, float]:
        """{sender: W[rank, sender]} over the in-neighbours of `rank`."""
        return dict(self._phase(step).in_weights[self._rank(rank)])

    def self_weight(self, rank: int, step: int = 0) -> float:
        return self._phase(step).self_weights[self._rank(rank)]

    def mixing_matrix(self, step: int = 0) -> np.ndarray:
        """Dense float64 W of `step` (read-only: copy it to modify)."""
        return self._phase(step).matrix

    def is_undirected(self, step: int = 0) -> bool:
        """True when every edge of `step` also runs the other way (the weights may still differ)."""
        return self._phase(step).undirected

    def spectral_gap(self, step: int = 0) -> float:
        return self._phase(step).gap

    def degree(self, rank: int, step: int = 0) -> int:
        """Number of in-neighbours of `rank` at `step`."""
        return len(self._phase(step).in_neighbors[self._rank(rank)])
