"""Who talks to whom, and with what weight: directed graphs over ranks and their mixing matrices.

A directed edge j -> i means "j sends to i". The mixing matrix W holds in W[i, j] the weight receiver i puts
on sender j's value (W[i, i] is the self weight), so one averaging round is x_new = W @ x. A time-varying
topology repeats with a period: the graph at step t is the graph at t % period.
"""

from __future__ import annotations

import difflib
import inspect
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np

from .errors import ConfigError

WEIGHT_RULES = ("uniform", "metropolis")
_TOL = 1e-9
_MAX_LISTED = 10

Edge = tuple[int, int]  # (sender, receiver)


class TopologyError(ConfigError):
    """A topology was asked for something it cannot be; the message says what is wrong and how to fix it."""


class _Phase:
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

    Build one with the functions of this module (ring, torus_2d, from_edges, make_topology, ...). Each step's
    graph is computed once; queries after that are dictionary look-ups, cheap enough for every training step.
    """

    def __init__(self, name: str, phases: Sequence[_Phase], weights: str = "uniform", **params: Any) -> None:
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

    def _phase(self, step: int) -> _Phase:
        return self._phases[operator.index(step) % self.period]

    def _rank(self, rank: int) -> int:
        return _checked_rank(rank, self.size, "rank")

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


# ----------------------------------------------------------------------------------------------------------
# Matrix checks


def _stochastic_rows(matrix: np.ndarray, tol: float) -> bool:
    return (
        matrix.ndim == 2
        and matrix.size > 0
        and bool(np.all(matrix >= -tol))
        and bool(np.allclose(matrix.sum(axis=1), 1.0, rtol=0.0, atol=tol))
    )


def is_row_stochastic(W: np.ndarray, tol: float = _TOL) -> bool:
    """Nonnegative with rows summing to 1: each rank takes a weighted average of what it receives."""
    return _stochastic_rows(np.asarray(W, dtype=np.float64), tol)


def is_column_stochastic(W: np.ndarray, tol: float = _TOL) -> bool:
    """Nonnegative with columns summing to 1: each rank's mass is fully handed out (push-sum)."""
    return _stochastic_rows(np.asarray(W, dtype=np.float64).T, tol)


def is_doubly_stochastic(W: np.ndarray, tol: float = _TOL) -> bool:
    """Row and column stochastic: repeated mixing converges to the exact average."""
    return is_row_stochastic(W, tol) and is_column_stochastic(W, tol)


def spectral_gap(W: np.ndarray) -> float:
    """1 - |lambda_2(W)|: how fast mixing with a stochastic W reaches consensus (1 = one step, 0 = never)."""
    matrix = np.asarray(W, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise TopologyError(f"spectral gap needs a square matrix, got shape {matrix.shape}")
    if matrix.shape[0] == 1:
        return 1.0
    symmetric = np.allclose(matrix, matrix.T, rtol=0.0, atol=1e-12)
    eigenvalues = np.linalg.eigvalsh(matrix) if symmetric else np.linalg.eigvals(matrix)
    moduli = np.sort(np.abs(eigenvalues))[::-1]
    return float(max(0.0, 1.0 - moduli[1]))  # clip rounding noise of a disconnected graph


# ----------------------------------------------------------------------------------------------------------
# Validation helpers


def _checked_rank(rank: int, size: int, what: str) -> int:
    try:
        index = operator.index(rank)
    except TypeError:
        raise TopologyError(f"{what} must be an integer, got {rank!r}") from None
    if not 0 <= index < size:
        raise TopologyError(f"{what} {rank} is out of range; valid ranks are 0..{size - 1} (size is {size})")
    return index


def _checked_size(size: int) -> int:
    try:
        value = operator.index(size)
    except TypeError:
        raise TopologyError(f"size must be an integer >= 1, got {size!r}") from None
    if value < 1:
        raise TopologyError(f"size must be >= 1 (the number of ranks), got {size}")
    return value


def _checked_rule(weights: str) -> str:
    if weights not in WEIGHT_RULES:
        raise TopologyError(f"unknown weight rule {weights!r}; use one of: {', '.join(WEIGHT_RULES)}")
    return weights


def _listed(ranks: list[int]) -> str:
    if len(ranks) <= _MAX_LISTED:
        return str(ranks)
    return f"{ranks[:_MAX_LISTED]} ... ({len(ranks)} in all)"


# ----------------------------------------------------------------------------------------------------------
# Weighting: edge sets -> phases


def _both_ways(pairs: Iterable[Edge]) -> set[Edge]:
    """An undirected edge set as directed edges in both directions, without self loops."""
    return {edge for a, b in pairs if a != b for edge in ((a, b), (b, a))}


def _senders(size: int, edges: Iterable[Edge]) -> list[set[int]]:
    senders: list[set[int]] = [set() for _ in range(size)]
    for j, i in edges:
        senders[i].add(j)
    return senders


def _weighted_phase(size: int, edges: set[Edge], weights: str) -> _Phase:
    """Apply a weight rule to an edge set (self loops must already be removed)."""
    senders = _senders(size, edges)
    if _checked_rule(weights) == "uniform":
        rows = [{j: 1.0 / (len(s) + 1) for j in s} for s in senders]
        return _Phase(rows, [1.0 / (len(s) + 1) for s in senders])
    for j, i in sorted(edges):
        if (i, j) not in edges:
            raise TopologyError(
                f"metropolis weights need an undirected graph, but rank {j} sends to {i} and {i} does not "
                f"send to {j}; use weights='uniform' or add the reverse edges"
            )
    degrees = [len(s) for s in senders]
    rows = [{j: 1.0 / (1 + max(degrees[i], degrees[j])) for j in s} for i, s in enumerate(senders)]
    return _Phase(rows, [1.0 - sum(row.values()) for row in rows])


def _explicit_phase(size: int, weighted: dict[Edge, float]) -> _Phase:
    """Use given weights W[i, j]; the self weight takes what is left of each row."""
    rows: list[dict[int, float]] = [{} for _ in range(size)]
    for (j, i), weight in sorted(weighted.items()):
        if not math.isfinite(weight) or weight < 0:
            raise TopologyError(f"edge ({j}, {i}) has weight {weight}; mixing weights must be finite and >= 0")
        if weight > 0:
            rows[i][j] = weight
    for i, row in enumerate(rows):
        total = sum(row.values())
        if total > 1.0 + _TOL:
            raise TopologyError(
                f"row {i} of the mixing matrix sums to {total:g}; weights into each rank must sum to at most 1"
            )
    return _Phase(rows, [max(0.0, 1.0 - sum(row.values())) for row in rows])


def _matrix_phase(matrix: np.ndarray) -> _Phase:
    """Take a full mixing matrix as given, after checking it is row stochastic and nonnegative."""
    negative = np.argwhere(matrix < 0)
    if len(negative):
        i, j = negative[0]
        raise TopologyError(f"entry [{i}, {j}] of the mixing matrix is {matrix[i, j]:g}; weights must be >= 0")
    sums = matrix.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > _TOL)
    if len(bad):
        raise TopologyError(
            f"row {bad[0]} of the mixing matrix sums to {sums[bad[0]]:g}; with weights=None the matrix is W "
            "itself and each row must sum to 1 (or pass weights='uniform' to derive W from the edges)"
        )
    rows = [{int(j): float(matrix[i, j]) for j in np.flatnonzero(matrix[i]) if j != i} for i in range(len(matrix))]
    return _Phase(rows, [float(w) for w in np.diag(matrix)])


def _static(name: str, size: int, edges: set[Edge], weights: str, **params: object) -> Topology:
    return Topology(name, [_weighted_phase(size, edges, weights)], weights=weights, **params)


# ----------------------------------------------------------------------------------------------------------
# Built-in topologies


def ring(size: int, weights: str = "uniform") -> Topology:
    """Bidirectional ring: rank i talks to i - 1 and i + 1 (mod size)."""
    size = _checked_size(size)
    return _static("ring", size, _both_ways((i, (i + 1) % size) for i in range(size)), weights)


def _near_square(n: int) -> tuple[int, int]:
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def _near_cube(n: int) -> tuple[int, int, int]:
    first = max(d for d in range(1, round(n ** (1 / 3)) + 2) if d**3 <= n and n % d == 0)
    second, third = _near_square(n // first)
    a, b, c = sorted((first, second, third))
    return a, b, c


def _as_int(value: object) -> int:
    return int(value) if isinstance(value, str) else operator.index(value)


def _checked_shape(shape: object, dims: int, size: int) -> tuple[int, ...]:
    """A shape given as a tuple/list of ints or as text like '4x4' (from a strategy string)."""
    try:
        given = tuple(_as_int(p) for p in (shape.lower().split("x") if isinstance(shape, str) else shape))
    except (TypeError, ValueError):
        raise TopologyError(f"torus shape must be {dims} integers like {(2,) * dims}, got {shape!r}") from None
    if len(given) != dims or min(given) < 1:
        raise TopologyError(f"torus shape must be {dims} integers >= 1, got {shape!r}")
    if math.prod(given) != size:
        raise TopologyError(
            f"torus shape {given} has {math.prod(given)} nodes but size is {size}; "
            f"give a shape whose product is {size} or omit shape"
        )
    return given


def _grid_edges(shape: tuple[int, ...]) -> set[Edge]:
    """Nearest-neighbour stencil with wrap-around on a row-major grid; duplicates and self loops collapse."""
    ranks = np.arange(math.prod(shape))
    coords = np.unravel_index(ranks, shape)
    edges: set[Edge] = set()
    for axis, length in enumerate(shape):
        for shift in (-1, 1):
            moved = list(coords)
            moved[axis] = (coords[axis] + shift) % length
            senders = np.ravel_multi_index(tuple(moved), shape)
            edges.update((int(j), int(i)) for j, i in zip(senders, ranks, strict=True) if j != i)
    return edges


def torus_2d(size: int, shape: tuple[int, int] | None = None, weights: str = "uniform") -> Topology:
    """The FAST stencil: rank r at (r // cols, r % cols) talks to up/down/left/right with wrap-around."""
    size = _checked_size(size)
    dims = _near_square(size) if shape is None else _checked_shape(shape, 2, size)
    return _static("torus2d", size, _grid_edges(dims), weights, shape=dims)


def torus_3d(size: int, shape: tuple[int, int, int] | None = None, weights: str = "uniform") -> Topology:
    """Six-neighbour stencil with wrap-around on a near-cubic grid."""
    size = _checked_size(size)
    dims = _near_cube(size) if shape is None else _checked_shape(shape, 3, size)
    return _static("torus3d", size, _grid_edges(dims), weights, shape=dims)


def hypercube(size: int, weights: str = "uniform") -> Topology:
    """Rank i talks to i XOR 2^k: log2(size) neighbours, diameter log2(size)."""
    size = _checked_size(size)
    if size & (size - 1):
        lower = 1 << (size.bit_length() - 1)
        raise TopologyError(
            f"hypercube needs a power-of-two size, got {size}; use {lower} or {2 * lower} ranks, "
            "or a torus / exponential graph"
        )
    bits = size.bit_length() - 1
    return _static("hypercube", size, {(i ^ (1 << k), i) for i in range(size) for k in range(bits)}, weights)


def _hops(size: int) -> list[int]:
    """Powers of two 1, 2, 4, ... below size: the jumps of the exponential graphs."""
    return [1 << k for k in range((size - 1).bit_length())]


def exponential(size: int, weights: str = "uniform") -> Topology:
    """Static exponential graph (Ying et al. 2021), directed: rank i sends to (i + 2^k) mod size."""
    size = _checked_size(size)
    edges = {(i, (i + hop) % size) for i in range(size) for hop in _hops(size)}
    return _static("exponential", size, {(j, i) for j, i in edges if j != i}, weights)


def one_peer_exponential(size: int, weights: str = "uniform") -> Topology:
    """Time-varying exponential graph: at step t rank i sends only to (i + 2^(t % tau)) mod size.

    For a power-of-two size, tau = log2(size) consecutive rounds with weights 1/2 average exactly.
    """
    size = _checked_size(size)
    hops = _hops(size) or [1]
    phases = [
        _weighted_phase(size, {(i, (i + hop) % size) for i in range(size) if (i + hop) % size != i}, weights)
        for hop in hops
    ]
    return Topology("one_peer_exponential", phases, weights=weights)


def complete(size: int, weights: str = "uniform") -> Topology:
    """Everyone talks to everyone: one uniform round gives the exact average."""
    size = _checked_size(size)
    return _static("complete", size, {(j, i) for i in range(size) for j in range(size) if i != j}, weights)


def star(size: int, center: int = 0, weights: str = "uniform") -> Topology:
    """Every rank talks only to `center` (and it to them)."""
    size = _checked_size(size)
    center = _checked_rank(center, size, "star center")
    return _static("star", size, _both_ways((center, i) for i in range(size)), weights, center=center)


# ----------------------------------------------------------------------------------------------------------
# Custom graphs


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


def _check_connected(phase: _Phase) -> None:
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
            f"graph is not connected: ranks {_listed(apart)} cannot reach rank 0; add edges joining them to the rest"
        )
    cannot_reach = sorted(everyone - nx.ancestors(graph, 0) - {0})
    if cannot_reach:
        raise TopologyError(
            f"graph is not strongly connected: ranks {_listed(cannot_reach)} cannot reach rank 0; add edges "
            "from them towards the rest of the graph (or pass directed=False)"
        )
    unreached = sorted(everyone - nx.descendants(graph, 0) - {0})
    raise TopologyError(
        f"graph is not strongly connected: rank 0 cannot reach ranks {_listed(unreached)}; add edges "
        "into them from the rest of the graph (or pass directed=False)"
    )


def _custom(phase: _Phase, weights: str) -> Topology:
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
    size = _checked_size(size)
    parsed = [edge for edge in parsed if edge[0] != edge[1]]
    given = [weight is not None for _, _, weight in parsed]
    if any(given) and not all(given):
        raise TopologyError("some edges have a weight and some do not; give every edge a weight or none")
    if parsed and all(given):
        if weights != "uniform":
            raise TopologyError(f"edges carry explicit weights, so weights={weights!r} cannot apply; drop one")
        triples = [(j, i, w) for j, i, w in parsed if w is not None]
        return _custom(_explicit_phase(size, _explicit_weights(triples, directed)), "explicit")
    pairs = [(j, i) for j, i, _ in parsed]
    return _custom(_weighted_phase(size, set(pairs) if directed else _both_ways(pairs), weights), weights)


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
        return _custom(_matrix_phase(dense), "explicit")
    receivers, senders = np.nonzero(dense)
    edges = {(int(j), int(i)) for i, j in zip(receivers, senders, strict=True) if i != j}
    return _custom(_weighted_phase(len(dense), edges, weights), weights)


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


# ----------------------------------------------------------------------------------------------------------
# Registry


TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "ring": ring,
    "torus": torus_2d,
    "torus2d": torus_2d,
    "torus3d": torus_3d,
    "hypercube": hypercube,
    "exp": exponential,
    "exponential": exponential,
    "exp1": one_peer_exponential,
    "one_peer_exponential": one_peer_exponential,
    "complete": complete,
    "star": star,
}


def _check_options(what: str, builder: Callable[..., Topology], skip: str, options: dict[str, object]) -> None:
    accepted = [p for p in inspect.signature(builder).parameters if p != skip]
    for key in options:
        if key not in accepted:
            takes = ", ".join(accepted) if accepted else "no options"
            raise TopologyError(f"{what} has no option {key!r}; it accepts: {takes}")


def _check_same_size(topology: Topology, size: int) -> Topology:
    if topology.size != size:
        raise TopologyError(f"{topology!r} has {topology.size} ranks but {size} are running; build it with size {size}")
    return topology


def make_topology(spec: str | Topology | nx.Graph, size: int, **options: object) -> Topology:
    """A Topology from a registry name, a networkx graph, or a Topology (returned as is, options unused)."""
    size = _checked_size(size)
    if isinstance(spec, Topology):
        return _check_same_size(spec, size)
    if isinstance(spec, nx.Graph):
        _check_options("a networkx graph topology", from_networkx, "graph", options)
        return _check_same_size(from_networkx(spec, **options), size)
    if not isinstance(spec, str):
        raise TopologyError(f"topology must be a name, a Topology or a networkx graph, got {type(spec).__name__}")
    name = spec.strip().lower()
    if name not in TOPOLOGIES:
        close = difflib.get_close_matches(name, TOPOLOGIES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise TopologyError(f"unknown topology '{spec}'{hint}; choose one of: {', '.join(sorted(TOPOLOGIES))}")
    _check_options(f"topology '{name}'", TOPOLOGIES[name], "size", options)
    return TOPOLOGIES[name](size, **options)
