"""Topologies by name: the registry a strategy string (``dpsgd:ring``) or ``fast run --topology`` looks up."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from functools import partial

import networkx as nx

from fast_core.topology.base import Topology
from fast_core.topology.builtin import (
    complete,
    exponential,
    hypercube,
    one_peer_exponential,
    ring,
    star,
    torus_2d,
    torus_3d,
)
from fast_core.topology.checks import TopologyError, checked_size
from fast_core.topology.custom import from_networkx
from fast_core.topology.finite_time import base_graph, k_peer_exponential

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
    "expk": k_peer_exponential,
    "k_peer_exponential": k_peer_exponential,
    "base": base_graph,
    "complete": complete,
    "star": star,
}
# fixed k for strategy strings, which cannot pass topology options: "dpsgd:base3" is the Base-3 graph (k = 2)
TOPOLOGIES.update({f"base{k + 1}": partial(base_graph, k=k) for k in range(1, 8)})
TOPOLOGIES.update({f"exp{k}": partial(k_peer_exponential, k=k) for k in range(2, 8)})


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
    size = checked_size(size)
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
