"""One-process tests of "no silent corruption": the finite check, refusals, canonical strategy strings, kinds."""

from __future__ import annotations

import logging

import networkx as nx
import numpy as np
import pytest

from fast_core import LocalCluster
from fast_core.metrics import Metrics
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.runtime.agreement import _ranks
from fast_core.strategies import DPSGD, SGP, Every, Gossip, Schedule, Strategy, warmup
from fast_core.strategies.base import StepContext
from fast_core.strategies.canonical import canonical_strategy
from fast_core.strategies.integrity import NonFiniteError, all_finite, check_own, refused
from fast_core.strategies.spec import make_strategy
from fast_core.topology import make_topology


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_all_finite_finds_any_nan_or_inf(dtype) -> None:
    x = np.linspace(-1, 1, 1001).astype(dtype)
    assert all_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[517] = bad
        assert not all_finite(y)
        assert not all_finite(y.reshape(7, 11, 13))


def test_all_finite_is_exact_when_the_squares_overflow() -> None:
    assert all_finite(np.full(10, 1e30, dtype=np.float32))  # x.x overflows; the buffer is still finite
    assert all_finite(np.full(10, 1e200))


def _context(rank: int = 1, size: int = 4) -> StepContext:
    return StepContext(LocalCluster(size).engine(rank), SoftmaxRegression(3, 2), Metrics())


def test_a_refusal_is_counted_every_time_and_logged_once_per_neighbour(caplog) -> None:
    ctx = _context()
    ctx.step = 7
    bad = np.array([1.0, np.nan])
    with caplog.at_level(logging.WARNING, logger="fast"):
        assert not refused(ctx, 0, np.ones(2))
        assert refused(ctx, 0, bad) and refused(ctx, 0, bad) and refused(ctx, 2, bad, "gradients")
    assert ctx.metrics.refused_messages == 3
    assert ctx.metrics.as_dict()["refused_messages"] == 3
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("rank 1 refused parameters from rank 0 at step 7"), messages
    assert messages[1].startswith("rank 1 refused gradients from rank 2 at step 7"), messages


def test_own_state_is_checked_every_k_rounds_and_names_rank_and_step() -> None:
    ctx = _context(rank=3)
    nan = np.array([0.0, np.nan])
    ctx.round = ctx.step = 5
    check_own(ctx, nan, every=8)  # not a checked round
    with pytest.raises(NonFiniteError, match=r"^rank 3's gradients hold NaN or Inf at step 5;"):
        check_own(ctx, nan, "gradients", every=1)
    ctx.round = 16
    with pytest.raises(NonFiniteError, match="rank 3's parameters"):
        check_own(ctx, nan, every=8)


@pytest.mark.parametrize(
    "spec",
    [
        "allreduce",
        "localsgd:period=8",
        "dpsgd:exp1,every=4,warmup=50",
        "async:torus,staleness=3",
        "adpsgd:ring",
        "sgp",
        "gossip:push,synchronous=false",
        "fast:ring,synchronous=true",
        "easgd:synchronous=false,alpha=0.1",
        "localsgd:every=2",
    ],
)
def test_canonical_strategy_spells_every_option_and_reads_back(spec: str) -> None:
    text = canonical_strategy(make_strategy(spec))
    assert canonical_strategy(make_strategy(text)) == text


def test_canonical_strategy_examples() -> None:
    assert canonical_strategy(make_strategy("localsgd")) == "localsgd:period=4"
    spelled = "dpsgd:topology=ring,weights=uniform,compress=none,qgm=0.0"
    assert canonical_strategy(make_strategy("dpsgd:ring")) == spelled
    assert canonical_strategy(make_strategy("dpsgd:ring")) != canonical_strategy(make_strategy("dpsgd:torus"))
    assert canonical_strategy(make_strategy("allreduce:warmup=5")) == "allreduce:compress=none,warmup=5"
    nested = "schedule(3:allreduce:compress=none;none:sgp:topology=exp1,compress=none,warmup=4)"
    assert canonical_strategy(warmup(3, warmup(4, "sgp"))) == nested
    spelled = "fast:topology=torus,synchronous=false,restart_every=1,reset_optimizer=false,compress=topk:ratio=0.1"
    assert canonical_strategy(make_strategy("fast:compress=topk:ratio=0.1")) == spelled
    spelled = "async:topology=ring,staleness=none,weights=uniform,remix_stale=false,keep_progress=true,compress=int8"
    assert canonical_strategy(make_strategy("async:ring,compress=int8")) == spelled
    assert canonical_strategy(Every(2, Schedule([(5, "sgp"), (None, "allreduce")]))).startswith("every(2,schedule(")


def test_canonical_strategy_tells_topology_objects_apart_by_their_weights() -> None:
    ring, torus = make_topology("ring", 4), make_topology("torus", 4)
    assert canonical_strategy(DPSGD(ring)) == canonical_strategy(DPSGD(make_topology("ring", 4)))
    assert canonical_strategy(DPSGD(ring)) != canonical_strategy(DPSGD(torus))
    assert canonical_strategy(SGP(nx.cycle_graph(4))) != canonical_strategy(SGP(nx.path_graph(4)))


def test_per_rank_options_are_left_out_of_the_shared_string() -> None:
    one, two = Gossip("pull", synchronous=False, seed=1), Gossip("pull", synchronous=False, seed=2)
    assert canonical_strategy(one) != canonical_strategy(two)
    assert canonical_strategy(one, shared=True) == canonical_strategy(two, shared=True)
    # the synchronous variant draws every rank's peers from one seed: it must agree
    synchronous = [canonical_strategy(Gossip("pull", seed=seed), shared=True) for seed in (1, 2)]
    assert synchronous[0] != synchronous[1]


def test_a_strategy_of_ones_own_is_described_without_addresses() -> None:
    class Mine(Strategy):
        def __init__(self) -> None:
            self.thing = object()

    assert " at 0x" not in canonical_strategy(Mine())
    assert canonical_strategy(Mine()) == canonical_strategy(Mine())


def test_rank_lists_read_as_ranges() -> None:
    assert _ranks([0]) == "rank 0"
    assert _ranks([1, 2, 3]) == "ranks 1-3"
    assert _ranks([0, 2, 5, 6, 7]) == "ranks 0, 2, 5-7"


def test_an_unknown_collective_kind_is_refused() -> None:
    engine = LocalCluster(1).engine(0)
    with pytest.raises(ValueError, match="unknown collective kind 'grads'"):
        engine.allreduce(np.zeros(2), kind="grads")
    buf = np.ones(2)
    engine.allreduce(buf, kind="gradients")
    engine.broadcast(buf, kind="job")
    np.testing.assert_array_equal(buf, np.ones(2))
