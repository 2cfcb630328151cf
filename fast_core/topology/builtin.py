"""The built-in topologies: ring, 2-D and 3-D torus, hypercube, exponential graphs, complete graph and star."""

from __future__ import annotations

import math
import operator

import numpy as np

from fast_core.topology.base import Edge, Phase, Topology
from fast_core.topology.checks import TopologyError, checked_rank, checked_size
from fast_core.topology.weights import both_ways, weighted_phase


def _static(name: str, size: int, edges: set[Edge], weights: str, **params: object) -> Topology:
    return Topology(name, [weighted_phase(size, edges, weights)], weights=weights, **params)


def ring(size: int, weights: str = "uniform") -> Topology:
    """Bidirectional ring: rank i talks to i - 1 and i + 1 (mod size)."""
    size = checked_size(size)
    return _static("ring", size, both_ways((i, (i + 1) % size) for i in range(size)), weights)


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
    size = checked_size(size)
    dims = _near_square(size) if shape is None else _checked_shape(shape, 2, size)
    return _static("torus2d", size, _grid_edges(dims), weights, shape=dims)


def torus_3d(size: int, shape: tuple[int, int, int] | None = None, weights: str = "uniform") -> Topology:
    """Six-neighbour stencil with wrap-around on a near-cubic grid."""
    size = checked_size(size)
    dims = _near_cube(size) if shape is None else _checked_shape(shape, 3, size)
    return _static("torus3d", size, _grid_edges(dims), weights, shape=dims)


def hypercube(size: int, weights: str = "uniform") -> Topology:
    """Rank i talks to i XOR 2^k: log2(size) neighbours, diameter log2(size)."""
    size = checked_size(size)
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
    size = checked_size(size)
    edges = {(i, (i + hop) % size) for i in range(size) for hop in _hops(size)}
    return _static("exponential", size, {(j, i) for j, i in edges if j != i}, weights)


def peer_phases(size: int, k: int, weights: str) -> list[Phase]:
    """One phase per base-(k+1) digit t: rank i sends to (i + m (k+1)^t) mod size for m = 1..k."""
    hops = [(k + 1) ** t for t in range(max(1, _digits(size, k + 1)))]
    phases = []
    for hop in hops:
        edges = {(i, (i + m * hop) % size) for i in range(size) for m in range(1, k + 1)}
        phases.append(weighted_phase(size, {(j, i) for j, i in edges if j != i}, weights))
    return phases


def _digits(size: int, base: int) -> int:
    """How many base-`base` digits size - 1 has: the least tau with base^tau >= size."""
    tau = 0
    while base**tau < size:
        tau += 1
    return tau


def one_peer_exponential(size: int, weights: str = "uniform") -> Topology:
    """Time-varying exponential graph: at step t rank i sends only to (i + 2^(t % tau)) mod size.

    For a power-of-two size, tau = log2(size) consecutive rounds with weights 1/2 average exactly.
    """
    size = checked_size(size)
    return Topology("one_peer_exponential", peer_phases(size, 1, weights), weights=weights)


def complete(size: int, weights: str = "uniform") -> Topology:
    """Everyone talks to everyone: one uniform round gives the exact average."""
    size = checked_size(size)
    return _static("complete", size, {(j, i) for i in range(size) for j in range(size) if i != j}, weights)


def star(size: int, center: int = 0, weights: str = "uniform") -> Topology:
    """Every rank talks only to `center` (and it to them)."""
    size = checked_size(size)
    center = checked_rank(center, size, "star center")
    return _static("star", size, both_ways((center, i) for i in range(size)), weights, center=center)
