"""Topologies checked against values worked out by hand: neighbour sets, weights, known spectral gaps."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from fast_core.errors import ConfigError
from fast_core.topology import (
    TOPOLOGIES,
    Topology,
    TopologyError,
    complete,
    exponential,
    from_adjacency,
    from_edges,
    from_networkx,
    hypercube,
    is_column_stochastic,
    is_doubly_stochastic,
    is_row_stochastic,
    make_topology,
    one_peer_exponential,
    ring,
    spectral_gap,
    star,
    torus_2d,
    torus_3d,
)

BUILT_INS = [
    ring(16),
    ring(2),
    torus_2d(16),
    torus_2d(8),
    torus_3d(27),
    torus_3d(12),
    hypercube(8),
    exponential(8),
    exponential(12),
    one_peer_exponential(16),
    complete(5),
    star(6),
    ring(10, weights="metropolis"),
    star(6, weights="metropolis"),
]


# ---- neighbour sets ----------------------------------------------------------------------------------------


def test_torus_2d_stencil_by_hand() -> None:
    topo = torus_2d(16)
    assert topo.shape == (4, 4)
    assert topo.in_neighbors(5) == [1, 4, 6, 9]
    assert topo.out_neighbors(5) == [1, 4, 6, 9]
    assert topo.in_neighbors(0) == [1, 3, 4, 12]
    assert all(topo.degree(r) == 4 for r in range(16))


def test_torus_2x4_duplicates_collapse() -> None:
    topo = torus_2d(8, shape=(2, 4))
    # rank 0 at (0, 0): up and down are both rank 4, left is 3, right is 1
    assert topo.in_neighbors(0) == [1, 3, 4]
    assert topo.in_weights(0) == pytest.approx({1: 0.25, 3: 0.25, 4: 0.25})
    assert topo.self_weight(0) == pytest.approx(0.25)


@pytest.mark.parametrize(("size", "shape"), [(16, (4, 4)), (8, (2, 4)), (12, (3, 4)), (7, (1, 7)), (1, (1, 1))])
def test_torus_2d_default_shape(size: int, shape: tuple[int, int]) -> None:
    assert torus_2d(size).shape == shape


@pytest.mark.parametrize(("size", "shape"), [(8, (2, 2, 2)), (27, (3, 3, 3)), (12, (2, 2, 3))])
def test_torus_3d_default_shape(size: int, shape: tuple[int, int, int]) -> None:
    assert torus_3d(size).shape == shape


def test_torus_1xn_is_a_ring() -> None:
    np.testing.assert_array_equal(torus_2d(7).mixing_matrix(), ring(7).mixing_matrix())


def test_torus_3d_neighbours() -> None:
    topo = torus_3d(27)
    assert all(topo.degree(r) == 6 for r in range(27))
    # rank 13 is the centre (1, 1, 1): its neighbours differ by one in one coordinate
    assert topo.in_neighbors(13) == [4, 10, 12, 14, 16, 22]
    # a 2x2x2 torus is the 3-cube
    np.testing.assert_array_equal(torus_3d(8).mixing_matrix(), hypercube(8).mixing_matrix())


def test_hypercube_neighbours() -> None:
    assert sorted(hypercube(8).in_neighbors(5)) == [1, 4, 7]
    assert hypercube(1).mixing_matrix().tolist() == [[1.0]]


def test_exponential_is_directed() -> None:
    topo = exponential(8)
    assert topo.out_neighbors(0) == [1, 2, 4]
    assert topo.in_neighbors(0) == [4, 6, 7]
    assert not topo.is_undirected()
    assert topo.in_weights(0) == pytest.approx({4: 0.25, 6: 0.25, 7: 0.25})
    # N = 6: hops 1, 2, 4
    assert exponential(6).in_neighbors(0) == [2, 4, 5]


def test_ring_of_two_has_one_neighbour() -> None:
    topo = ring(2)
    assert topo.in_neighbors(0) == [1]
    np.testing.assert_allclose(topo.mixing_matrix(), [[0.5, 0.5], [0.5, 0.5]])


def test_star_and_complete() -> None:
    topo = star(5, center=2)
    assert topo.in_neighbors(2) == [0, 1, 3, 4]
    assert topo.in_neighbors(0) == [2]
    assert topo.in_weights(2) == pytest.approx({0: 0.2, 1: 0.2, 3: 0.2, 4: 0.2})
    assert topo.self_weight(4) == pytest.approx(0.5)
    assert topo.is_undirected()
    np.testing.assert_allclose(complete(4).mixing_matrix(), np.full((4, 4), 0.25))
    assert complete(4).out_neighbors(3) == [0, 1, 2]


@pytest.mark.parametrize("builder", [ring, torus_2d, torus_3d, hypercube, exponential, complete, star])
def test_single_rank(builder) -> None:
    topo = builder(1)
    assert topo.mixing_matrix().tolist() == [[1.0]]
    assert topo.in_neighbors(0) == []
    assert topo.spectral_gap() == 1.0


# ---- spectral gaps -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [5, 7, 16, 30])
def test_ring_gap_closed_form(n: int) -> None:
    # circulant W with 1/3 on -1, 0, +1: eigenvalues (1 + 2 cos(2 pi k / N)) / 3
    assert ring(n).spectral_gap() == pytest.approx(1 - (1 + 2 * math.cos(2 * math.pi / n)) / 3, abs=1e-12)


def test_known_gaps() -> None:
    assert ring(16).spectral_gap() == pytest.approx(0.0507, abs=1e-4)
    assert ring(4).spectral_gap() == pytest.approx(2 / 3)  # eigenvalues 1, 1/3, -1/3, 1/3
    assert torus_2d(16).spectral_gap() == pytest.approx(0.4)
    assert complete(6).spectral_gap() == pytest.approx(1.0)


@pytest.mark.parametrize(("n", "gap"), [(8, 0.5), (16, 0.4), (32, 1 / 3)])
def test_exponential_gap(n: int, gap: float) -> None:
    assert exponential(n).spectral_gap() == pytest.approx(gap, abs=1e-9)
    assert gap == pytest.approx(2 / (1 + math.log2(n)))


def test_spectral_gap_of_plain_matrix() -> None:
    assert spectral_gap(np.array([[0.5, 0.5], [0.5, 0.5]])) == pytest.approx(1.0)
    assert spectral_gap(np.eye(3)) == 0.0  # three separate ranks never agree
    assert spectral_gap(np.array([[0.9, 0.1], [0.3, 0.7]])) == pytest.approx(0.4)  # eigenvalues 1 and 0.6


# ---- one-peer exponential graph ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_one_peer_exponential_averages_exactly(n: int) -> None:
    topo = one_peer_exponential(n)
    tau = int(math.log2(n))
    assert topo.period == tau
    product = np.eye(n)
    for step in range(tau):
        if step > 0:
            assert np.abs(product - 1 / n).max() > 1e-3, f"exact already after {step} steps"
        product = topo.mixing_matrix(step) @ product
    np.testing.assert_allclose(product, np.full((n, n), 1 / n), rtol=0, atol=1e-12)


def test_one_peer_exponential_schedule() -> None:
    topo = one_peer_exponential(8)
    assert topo.is_dynamic
    assert [topo.out_neighbors(0, t) for t in range(4)] == [[1], [2], [4], [1]]
    assert [topo.in_neighbors(0, t) for t in range(3)] == [[7], [6], [4]]
    assert topo.in_weights(3, 1) == {1: 0.5}
    assert topo.self_weight(3, 1) == 0.5
    single = one_peer_exponential(1)
    assert single.mixing_matrix(5).tolist() == [[1.0]]
    assert not single.is_dynamic


def test_steps_are_cached_and_read_only() -> None:
    topo = one_peer_exponential(8)
    assert topo.mixing_matrix(1) is topo.mixing_matrix(4)
    with pytest.raises(ValueError):
        topo.mixing_matrix(0)[0, 0] = 2.0
    topo.in_neighbors(0).append(99)  # a copy: the cached list is unchanged
    assert topo.in_neighbors(0) == [7]


# ---- weights and stochasticity -----------------------------------------------------------------------------


def test_metropolis_by_hand() -> None:
    # pendant 0 - 1 plus triangle 1 - 2 - 3: degrees 1, 3, 2, 2
    topo = from_edges([(0, 1), (1, 2), (1, 3), (2, 3)], weights="metropolis")
    expected = np.array(
        [
            [3 / 4, 1 / 4, 0, 0],
            [1 / 4, 1 / 4, 1 / 4, 1 / 4],
            [0, 1 / 4, 5 / 12, 1 / 3],
            [0, 1 / 4, 1 / 3, 5 / 12],
        ]
    )
    W = topo.mixing_matrix()
    np.testing.assert_allclose(W, expected, atol=1e-15)
    np.testing.assert_array_equal(W, W.T)
    assert is_doubly_stochastic(W)


@pytest.mark.parametrize("topo", BUILT_INS, ids=repr)
def test_built_ins_are_row_stochastic(topo: Topology) -> None:
    for step in range(topo.period):
        assert is_row_stochastic(topo.mixing_matrix(step))


@pytest.mark.parametrize(
    "topo",
    [ring(9), torus_2d(16), torus_2d(8), torus_3d(27), hypercube(16), complete(5), exponential(16)],
    ids=repr,
)
def test_regular_graphs_are_doubly_stochastic(topo: Topology) -> None:
    assert is_doubly_stochastic(topo.mixing_matrix())


def test_star_is_row_but_not_column_stochastic() -> None:
    W = star(5).mixing_matrix()
    assert is_row_stochastic(W)
    assert not is_column_stochastic(W)  # the centre's column: 1/5 + 4 * 1/2
    assert W[:, 0].sum() == pytest.approx(2.2)


def test_stochastic_checks_on_plain_matrices() -> None:
    assert is_row_stochastic([[0.5, 0.5], [0.2, 0.8]])
    assert not is_column_stochastic([[0.5, 0.5], [0.2, 0.8]])
    assert not is_row_stochastic([[1.5, -0.5], [-0.5, 1.5]])  # rows sum to 1 but a weight is negative
    assert is_doubly_stochastic(np.full((3, 3), 1 / 3))


# ---- custom graphs -----------------------------------------------------------------------------------------


def test_custom_builders_agree() -> None:
    edges = [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]
    adjacency = np.zeros((4, 4))
    for j, i in edges:
        adjacency[i, j] = adjacency[j, i] = 1
    graph = nx.Graph(edges)
    matrices = [
        from_edges(edges).mixing_matrix(),
        from_adjacency(adjacency).mixing_matrix(),
        from_networkx(graph).mixing_matrix(),
    ]
    for W in matrices[1:]:
        np.testing.assert_array_equal(W, matrices[0])
    # rank 0 has neighbours 1, 2, 3 -> 1/4 each; rank 1 has neighbours 0, 2 -> 1/3 each
    np.testing.assert_allclose(matrices[0][0], [0.25, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(matrices[0][1], [1 / 3, 1 / 3, 1 / 3, 0])


def test_custom_directed_builders_agree() -> None:
    edges = [(0, 1), (1, 2), (2, 0), (0, 2)]  # j sends to i
    adjacency = np.zeros((3, 3))
    for j, i in edges:
        adjacency[i, j] = 1
    topo = from_edges(edges, directed=True)
    assert topo.in_neighbors(2) == [0, 1]
    assert topo.out_neighbors(0) == [1, 2]
    np.testing.assert_array_equal(from_adjacency(adjacency).mixing_matrix(), topo.mixing_matrix())
    np.testing.assert_array_equal(from_networkx(nx.DiGraph(edges)).mixing_matrix(), topo.mixing_matrix())


def test_explicit_weights_are_used_as_given() -> None:
    topo = from_edges([(1, 0, 0.3), (0, 1, 0.6)], directed=True)
    np.testing.assert_allclose(topo.mixing_matrix(), [[0.7, 0.3], [0.6, 0.4]])
    undirected = from_edges([(0, 1, 0.25), (1, 2, 0.5)])
    np.testing.assert_allclose(undirected.mixing_matrix(), [[0.75, 0.25, 0], [0.25, 0.25, 0.5], [0, 0.5, 0.5]])
    graph = nx.DiGraph()
    graph.add_weighted_edges_from([("a", "b", 0.6), ("b", "a", 0.3)])  # relabelled a -> 0, b -> 1
    np.testing.assert_allclose(from_networkx(graph).mixing_matrix(), topo.mixing_matrix())
    W = np.array([[0.7, 0.3], [0.6, 0.4]])
    np.testing.assert_array_equal(from_adjacency(W, weights=None).mixing_matrix(), W)


def test_graph_round_trips_through_networkx() -> None:
    topo = exponential(8)
    graph = topo.graph()
    assert graph[4][0]["weight"] == pytest.approx(0.25)  # 4 sends to 0
    assert graph[0][0]["weight"] == pytest.approx(0.25)  # self loop holds the self weight
    np.testing.assert_allclose(from_networkx(graph).mixing_matrix(), topo.mixing_matrix())


# ---- registry ----------------------------------------------------------------------------------------------


def test_make_topology() -> None:
    assert set(TOPOLOGIES) >= {"ring", "torus", "torus2d", "torus3d", "hypercube", "exp", "exp1", "star"}
    torus = make_topology("torus", 8, shape=(2, 4), weights="metropolis")
    assert torus.shape == (2, 4)
    assert repr(torus) == "Topology('torus2d', size=8, shape=(2, 4), weights='metropolis')"
    assert repr(make_topology("torus", 16)) == "Topology('torus2d', size=16, shape=(4, 4))"
    assert make_topology("torus2d", 8, shape="4x2").shape == (4, 2)
    assert make_topology("exp1", 8).period == 3
    topo = ring(4)
    assert make_topology(topo, 4) is topo
    assert make_topology(nx.cycle_graph(4), 4).in_neighbors(0) == [1, 3]


# ---- errors ------------------------------------------------------------------------------------------------


def test_topology_error_is_a_config_error() -> None:
    assert issubclass(TopologyError, ConfigError)
    assert issubclass(TopologyError, ValueError)


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: make_topology("tours", 4),
            r"unknown topology 'tours' \(did you mean 'torus'\?\); choose one of",
        ),
        (lambda: make_topology("ring", 4, shape=(2, 2)), r"no option 'shape'; it accepts: weights"),
        (lambda: make_topology(ring(4), 8), r"has 4 ranks but 8 are running"),
        (lambda: ring(16).in_neighbors(16), r"rank 16 is out of range; valid ranks are 0\.\.15"),
        (lambda: ring(16).self_weight(-1), r"rank -1 is out of range"),
        (lambda: ring(0), r"size must be >= 1"),
        (lambda: torus_2d(8, shape=(3, 3)), r"torus shape \(3, 3\) has 9 nodes but size is 8; give a shape"),
        (lambda: torus_3d(8, shape=(2, 4)), r"torus shape must be 3 integers"),
        (lambda: hypercube(12), r"hypercube needs a power-of-two size, got 12; use 8 or 16"),
        (lambda: star(4, center=4), r"star center 4 is out of range"),
        (lambda: ring(4, weights="metro"), r"unknown weight rule 'metro'; use one of: uniform, metropolis"),
        (lambda: exponential(8, weights="metropolis"), r"metropolis weights need an undirected graph"),
        (lambda: one_peer_exponential(8, weights="metropolis"), r"metropolis weights need an undirected"),
        (
            lambda: from_edges([(0, 1), (2, 3)], weights="metropolis", directed=True),
            r"metropolis weights need an undirected graph",
        ),
        (
            lambda: from_edges([(0, 1), (1, 2), (3, 4)]),
            r"graph is not connected: ranks \[3, 4\] cannot reach rank 0",
        ),
        (
            lambda: from_edges([(0, 1), (1, 2), (2, 0), (5, 6)], size=7),
            r"ranks \[3, 4, 5, 6\] cannot reach rank 0",
        ),
        (
            lambda: from_edges([(0, 1), (1, 2)], directed=True),
            r"graph is not strongly connected: ranks \[1, 2\] cannot reach rank 0",
        ),
        (
            lambda: from_edges([(1, 0), (2, 1)], directed=True),
            r"not strongly connected: rank 0 cannot reach ranks \[1, 2\]",
        ),
        (
            lambda: from_adjacency([[0, 1, 0], [1, 0, 0], [0, 0, 0]]),
            r"graph is not connected: ranks \[2\] cannot reach rank 0",
        ),
        (
            lambda: from_edges([(0, 3, 0.5), (1, 3, 0.7), (3, 0, 0.5), (3, 1, 0.5), (3, 2, 0.5)], directed=True),
            r"row 3 of the mixing matrix sums to 1.2; weights into each rank must sum to at most 1",
        ),
        (lambda: from_edges([(0, 1, -0.2)]), r"edge \(0, 1\) has weight -0.2; mixing weights must be"),
        (lambda: from_edges([(0, 1, 0.5), (1, 2)]), r"some edges have a weight and some do not"),
        (lambda: from_edges([(0, 1), (1, 5)], size=4), r"names rank 5; ranks must be 0\.\.3"),
        (lambda: from_edges([]), r"no edges and no size"),
        (lambda: from_adjacency(np.ones((2, 3))), r"must be square and non-empty, got shape \(2, 3\)"),
        (
            lambda: from_adjacency([[0.5, 0.5], [0.5, 0.4]], weights=None),
            r"row 1 of the mixing matrix sums to 0.9",
        ),
        (
            lambda: from_adjacency([[1.5, -0.5], [0.5, 0.5]], weights=None),
            r"entry \[0, 1\] of the mixing matrix is -0.5; weights must be >= 0",
        ),
        (
            lambda: from_networkx(nx.DiGraph([(0, 1), (1, 2), (2, 0)]), weights="metropolis"),
            r"metropolis weights need an undirected graph",
        ),
    ],
)
def test_errors(call, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        call()
