"""Base-(k+1) graphs (Takezawa et al. 2023) and k-peer exponential graphs: exact average after one period.

The round counts are checked against a closed form written here from the paper's construction and, for k = 1, 2, 3
and N = 2..20, against the periods of the authors' code (github.com/yukiTakezawa/BaseGraph, BaseGraph(N, k)), whose
mixing matrices ours equal entry by entry (compared once, by hand, for k = 1..5 and N = 2..69).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fast_core import LocalCluster, Worker
from fast_core.cli.topology import describe
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.topology import (
    Topology,
    TopologyError,
    base_graph,
    is_doubly_stochastic,
    k_peer_exponential,
    make_topology,
    one_peer_exponential,
)
from fast_core.topology.heal import heal

# BaseGraph(N, k) of the authors' code: len(w_list) for N = 2..20
AUTHORS_PERIODS = {
    1: [1, 3, 2, 5, 4, 5, 3, 7, 6, 7, 5, 7, 6, 7, 4, 9, 8, 9, 7],
    2: [1, 1, 2, 3, 2, 4, 3, 2, 4, 5, 3, 5, 5, 4, 4, 5, 3, 6, 5],
    3: [1, 1, 1, 3, 2, 3, 2, 2, 4, 4, 2, 4, 4, 4, 2, 5, 3, 5, 4],
}


def _factor_count(n: int, k: int) -> int | None:
    """Rounds of the k-peer hyper-hypercube: factors of n, the largest <= k+1 first; None if a prime is > k+1."""
    count = 0
    for factor in range(k + 1, 1, -1):
        while n % factor == 0:
            n, count = n // factor, count + 1
    return count if n == 1 else None


def _simple_rounds(n: int, k: int) -> int:
    """Simple Base-(k+1) graph: the hyper-hypercube when it exists, else 2 p + 1 + [a > 1] for the leading
    base-(k+1) digit a (k+1)^p of n (p + [a > 1] rounds inside the parts, p + 1 of pairing and spreading)."""
    smooth = _factor_count(n, k)
    if smooth is not None:
        return smooth
    p = int(math.log(n, k + 1) + 1e-9)
    while (k + 1) ** (p + 1) <= n:
        p += 1
    a = n // (k + 1) ** p
    return 2 * p + 1 + (a > 1)


def expected_period(n: int, k: int) -> int:
    """Base-(k+1) graph: n = s q with s the part of n whose primes are <= k+1; the simple graph in blocks of q then
    the hyper-hypercube across the blocks, unless the simple graph over all n is strictly shorter."""
    s = math.prod(p ** _multiplicity(n, p) for p in range(2, k + 2) if _is_prime(p))
    q = n // s
    simple = _simple_rounds(n, k)
    if s == 1 or q == 1:
        return max(simple, 1)
    return min(simple, _simple_rounds(q, k) + _factor_count(s, k))


def _is_prime(p: int) -> bool:
    return all(p % d for d in range(2, math.isqrt(p) + 1))


def _multiplicity(n: int, p: int) -> int:
    count = 0
    while n % p == 0:
        n, count = n // p, count + 1
    return count


def _products(topology: Topology) -> list[np.ndarray]:
    """W(t)...W(0) for t = 0..period-1."""
    product, out = np.eye(topology.size), []
    for step in range(topology.period):
        product = topology.mixing_matrix(step) @ product
        out.append(product)
    return out


def _max_peers(topology: Topology) -> int:
    steps, ranks = range(topology.period), range(topology.size)
    return max(max(len(topology.in_neighbors(r, t)), len(topology.out_neighbors(r, t))) for r in ranks for t in steps)


def _check_finite_time(topology: Topology, k: int) -> None:
    n = topology.size
    products = _products(topology)
    np.testing.assert_allclose(products[-1], np.full((n, n), 1 / n), rtol=0, atol=1e-12)
    for step, product in enumerate(products[:-1]):
        assert np.abs(product - 1 / n).max() > 1e-3, f"exact already after {step + 1} of {topology.period} steps"
    for step in range(topology.period):
        assert is_doubly_stochastic(topology.mixing_matrix(step), tol=1e-12)
    assert _max_peers(topology) <= k


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("n", range(2, 21))
def test_base_graph_averages_exactly_with_at_most_k_peers(n: int, k: int) -> None:
    topology = base_graph(n, k)
    _check_finite_time(topology, k)
    assert all(topology.is_undirected(t) for t in range(topology.period))
    assert all(np.allclose(topology.mixing_matrix(t), topology.mixing_matrix(t).T) for t in range(topology.period))
    assert topology.period == expected_period(n, k) == AUTHORS_PERIODS[k][n - 2]
    assert topology.period <= 2 * math.log(n, k + 1) + 2  # the paper's bound on the length


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_base_graph_rounds_follow_the_closed_form_up_to_100(k: int) -> None:
    for n in range(2, 101):
        topology = base_graph(n, k)
        assert topology.period == expected_period(n, k), n
        assert topology.period <= 2 * math.log(n, k + 1) + 2, n
        assert np.allclose(_products(topology)[-1], 1 / n, rtol=0, atol=1e-12), n


@pytest.mark.parametrize(("n", "k", "rounds"), [(8, 1, 3), (9, 2, 2), (27, 2, 3), (16, 3, 2), (64, 3, 3)])
def test_base_graph_of_a_power_of_k_plus_1_is_the_hyper_hypercube(n: int, k: int, rounds: int) -> None:
    topology = base_graph(n, k)
    assert topology.period == rounds == round(math.log(n, k + 1))
    for t in range(rounds):  # every rank in a group of k+1 averaging uniformly
        assert {topology.self_weight(r, t) for r in range(n)} == {1 / (k + 1)}
        assert {topology.degree(r, t) for r in range(n)} == {k}


def test_base_2_graph_of_5_ranks_step_by_step() -> None:
    """5 = 4 + 1: the 4 average in 2 rounds, rank 4 takes 4/5 of rank 3's value, then ranks 0..3 spread it."""
    topology = base_graph(5, 1)
    assert topology.period == 5
    assert [topology.in_neighbors(4, t) for t in range(5)] == [[], [], [3], [], []]
    assert topology.in_weights(4, 2) == pytest.approx({3: 0.8}) and topology.self_weight(4, 2) == pytest.approx(0.2)
    assert topology.in_weights(3, 2) == pytest.approx({4: 0.8}) and topology.self_weight(3, 2) == pytest.approx(0.2)
    assert topology.in_weights(0, 2) == pytest.approx({1: 0.5})  # the idle ranks of the pairing round mix too
    x = np.arange(5.0) ** 2
    for t in range(5):
        x = topology.mixing_matrix(t) @ x
    np.testing.assert_allclose(x, np.full(5, 6.0), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("k", "sizes"), [(1, [2, 4, 8, 16, 32, 64]), (2, [3, 9, 27, 81]), (3, [4, 16, 64]), (7, [64])])
def test_k_peer_exponential_averages_exactly_for_powers_of_k_plus_1(k: int, sizes: list[int]) -> None:
    for n in sizes:
        topology = k_peer_exponential(n, k)
        assert topology.period == round(math.log(n, k + 1))  # tau = log_{k+1} N rounds
        _check_finite_time(topology, k)
        assert {topology.degree(r, t) for r in range(n) for t in range(topology.period)} == {k}
        hop = (k + 1) ** (1 % topology.period)  # step 1: rank 0 hears from -m (k+1) mod N, m = 1..k
        assert topology.in_neighbors(0, 1) == sorted((-m * hop) % n for m in range(1, k + 1))


def test_k_peer_exponential_with_one_peer_is_the_one_peer_exponential_graph() -> None:
    for n in [1, 5, 8, 12]:
        one, k1 = one_peer_exponential(n), k_peer_exponential(n, 1)
        assert one.period == k1.period
        for t in range(one.period):
            np.testing.assert_array_equal(one.mixing_matrix(t), k1.mixing_matrix(t))


def test_k_peer_exponential_of_other_sizes_is_doubly_stochastic_but_not_exact() -> None:
    topology = k_peer_exponential(10, 2)  # 10 is not a power of 3
    assert topology.period == 3 and all(is_doubly_stochastic(topology.mixing_matrix(t)) for t in range(3))
    assert np.abs(_products(topology)[-1] - 0.1).max() > 1e-3


def test_registry_names_and_options() -> None:
    assert make_topology("base", 6).k == 1 and make_topology("base", 6).period == 4
    assert make_topology("base", 6, k=2).period == make_topology("base3", 6).period == 2
    assert repr(make_topology("base4", 10)) == "Topology('base', size=10, k=3)"
    assert make_topology("expk", 9, k=2).period == make_topology("exp2", 9).period == 2
    assert make_topology("exp3", 16).k == 3
    single = base_graph(1, 3)
    assert single.period == 1 and single.mixing_matrix().tolist() == [[1.0]]
    # a lost rank rebuilds the graph for the survivors: exact again over 5
    healed = heal(base_graph(6, 1), [0, 1, 2, 4, 5])
    assert healed.period == 5 and np.allclose(_products(healed)[-1], 1 / 5, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: base_graph(6, k=0), r"k \(peers per rank per step\) must be >= 1, got 0"),
        (lambda: base_graph(6, k="two"), r"must be an integer >= 1, got 'two'"),
        (lambda: base_graph(6, weights="metropolis"), r"weights of its construction, not 'metropolis'"),
        (lambda: k_peer_exponential(8, 2, weights="metropolis"), r"metropolis weights need an undirected graph"),
        (lambda: make_topology("base", 6, shape=2), r"topology 'base' has no option 'shape'; it accepts: k, weights"),
    ],
)
def test_errors_say_what_to_change(call, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        call()


def test_fast_topology_describes_a_finite_time_topology() -> None:
    text = describe(make_topology("base", 6, k=1), step=2)
    assert "base k=1: 6 ranks, Base-(k+1) construction weights" in text
    assert "time-varying with period 4 (step 2 shown)" in text
    assert "spectral gap of one period W(3)...W(0): 1.0000" in text
    assert "exact average after one period (4 steps): yes" in text
    assert "most in-neighbours of a rank in a step of the period: 1" in text
    assert "exact average after one period (3 steps): no" in describe(k_peer_exponential(10, 2), step=0)


# ---- D-PSGD over the finite-time topologies: pure mixing reaches the exact mean --------------------------------


def _mix_only(topology: str, size: int, steps: int) -> None:
    """D-PSGD with lr 0 from a different start per rank: only the mixing moves the parameters."""

    def run(engine: Engine) -> None:
        model = SoftmaxRegression(3, 2, optimizer=SGD(0.0))
        starts = np.stack([np.random.default_rng(7 + r).normal(size=model.layout.size) + r for r in range(size)])
        mean = starts.mean(axis=0)
        model.set_params(starts[engine.rank])
        worker = Worker(model, f"dpsgd:{topology}", engine, broadcast_start=False).start()
        for step in range(steps):
            model.grads()[:] = 0.0
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            if step == steps - 2:  # one step short of the period: some rank is not there yet
                off = np.array([np.abs(model.params() - mean).max()])
                engine.allreduce(off, op="max")
                assert off[0] > 1e-6
        np.testing.assert_allclose(model.params(), mean, rtol=0, atol=1e-12)
        worker.close()

    LocalCluster(size, timeout=30).run(run)


@pytest.mark.parametrize(("name", "size"), [("base", 5), ("base", 6), ("base3", 7), ("base4", 10), ("exp2", 9)])
def test_dpsgd_reaches_the_exact_average_after_one_period(name: str, size: int) -> None:
    _mix_only(name, size, make_topology(name, size).period)
