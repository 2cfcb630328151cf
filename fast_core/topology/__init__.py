"""Who talks to whom, and with what weight: directed graphs over ranks and their mixing matrices.

A directed edge j -> i means "j sends to i". The mixing matrix W holds in W[i, j] the weight receiver i puts
on sender j's value (W[i, i] is the self weight), so one averaging round is x_new = W @ x. A time-varying
topology repeats with a period: the graph at step t is the graph at t % period.

Modules: ``base`` (the Topology class and its queries), ``matrix`` (stochasticity, spectral gap), ``weights``
(uniform and Metropolis-Hastings rules), ``builtin`` (ring, torus, hypercube, exponential, ...), ``finite_time``
(Base-(k+1) graphs and k-peer exponential graphs: exact average in finite time), ``custom``
(edge lists, adjacency matrices, networkx graphs), ``registry`` (names and ``make_topology``), ``checks``
(argument validation and TopologyError).
"""

from __future__ import annotations

from fast_core.topology.base import Edge, Topology
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
from fast_core.topology.checks import WEIGHT_RULES, TopologyError
from fast_core.topology.custom import from_adjacency, from_edges, from_networkx
from fast_core.topology.finite_time import base_graph, k_peer_exponential
from fast_core.topology.matrix import is_column_stochastic, is_doubly_stochastic, is_row_stochastic, spectral_gap
from fast_core.topology.registry import TOPOLOGIES, make_topology

__all__ = [
    "TOPOLOGIES",
    "WEIGHT_RULES",
    "Edge",
    "Topology",
    "TopologyError",
    "base_graph",
    "complete",
    "exponential",
    "from_adjacency",
    "from_edges",
    "from_networkx",
    "hypercube",
    "is_column_stochastic",
    "is_doubly_stochastic",
    "is_row_stochastic",
    "k_peer_exponential",
    "make_topology",
    "one_peer_exponential",
    "ring",
    "spectral_gap",
    "star",
    "torus_2d",
    "torus_3d",
]
