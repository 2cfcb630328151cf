"""Single-process tests of SGP: construction errors, one-rank behaviour, message format, repr."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from training import CLASSES, FEATURES

from fast_core import ConfigError, LocalCluster, Worker
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies.sgp import SGP
from fast_core.topology import TopologyError, ring


def test_default_topology_and_repr() -> None:
    assert SGP().topology == "exp1"
    assert SGP.name == "sgp"
    assert repr(SGP("ring")) == "SGP(topology='ring', compress='none')"


def test_unknown_topology_name_fails_at_construction_with_a_hint() -> None:
    with pytest.raises(TopologyError, match="did you mean 'exp1'"):
        SGP("exp11")


def test_topology_of_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="got int"):
        SGP(42)  # type: ignore[arg-type]


def test_topology_of_another_size_fails_at_setup() -> None:
    model = SoftmaxRegression(FEATURES, CLASSES)
    worker = Worker(model, SGP(ring(4)), LocalCluster(1).engine(0))
    with pytest.raises(TopologyError, match="4 ranks but 1 are running"):
        worker.start()


def _float32_exp1(engine: Engine) -> tuple[SGP, Worker, np.ndarray]:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.0), dtype="float32")
    model.set_params(np.full(model.layout.size, engine.rank, dtype=np.float32))
    sgp = SGP("exp1")
    worker = Worker(model, sgp, engine, broadcast_start=False).start()
    buffers = [sgp.numerator.__array_interface__["data"][0]]
    for _ in range(2):  # log2(4) rounds
        worker.before_step()
        worker.after_step()
        buffers.append(sgp.numerator.__array_interface__["data"][0])
    worker.close()
    return sgp, worker, np.array(buffers)


def test_float32_message_carries_the_weight_and_buffers_are_reused() -> None:
    """One message of layout.size + 1 float32 values per out-neighbour and step; the state is never reallocated."""
    results = LocalCluster(4, timeout=30).run(_float32_exp1)
    for rank, (sgp, worker, addresses) in enumerate(results):
        assert sgp.numerator.dtype == np.float32
        np.testing.assert_allclose(sgp.numerator, 1.5, rtol=0, atol=1e-6)  # mean of ranks 0..3
        assert sgp.weight == 1.0, rank
        assert len(set(addresses)) == 1, "the push-sum state was reallocated between steps"
        size = SoftmaxRegression(FEATURES, CLASSES).layout.size
        assert worker.metrics.messages_sent == 2
        assert worker.metrics.bytes_sent == 2 * (size + 1) * 4
        assert worker.metrics.bytes_received == worker.metrics.bytes_sent


def _networkx_cycle(engine: Engine) -> float:
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.0))
    model.set_params(np.full(model.layout.size, float(engine.rank)))
    sgp = SGP(nx.cycle_graph(3, create_using=nx.DiGraph))
    worker = Worker(model, sgp, engine, broadcast_start=False).start()
    for _ in range(80):
        worker.before_step()
        worker.after_step()
    worker.close()
    return float(np.max(np.abs(model.params() - 1.0)))


def test_accepts_a_directed_networkx_graph() -> None:
    assert max(LocalCluster(3, timeout=30).run(_networkx_cycle)) < 1e-9


def _rank_valued_every_3(engine: Engine, spec: str) -> np.ndarray:
    """Parameters start at the rank number and the optimizer changes nothing (lr 0): only the mixing moves them."""
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.0))
    model.set_params(np.full(model.layout.size, float(engine.rank)))
    worker = Worker(model, spec, engine, broadcast_start=False).start()
    for _ in range(3 * 4):  # 4 mixing rounds; log2(8) = 3 reach the exact average on the one-peer graph
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    return model.params().copy()


@pytest.mark.parametrize("spec", ["sgp:exp1,every=3", "dpsgd:exp1,every=3"])
def test_every_3_on_8_ranks_cycles_the_one_peer_graph_by_rounds(spec: str) -> None:
    """Regression: SGP picked the graph's phase from the worker's step. Mixing on steps 2, 5, 8, ... of a graph with
    3 phases (peers +1, +2, +4) then always used peer +4, and ranks ended at [2 3 4 5 2 3 4 5]. Indexed by its own
    rounds, it reaches 3.5 everywhere, as D-PSGD does."""
    results = LocalCluster(8, timeout=30).run(_rank_valued_every_3, spec)
    for rank, params in enumerate(results):
        np.testing.assert_allclose(params, 3.5, rtol=0, atol=1e-12, err_msg=f"{spec} rank {rank}")
