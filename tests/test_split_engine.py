"""Engine.split: groups of ranks by color, each a working engine whose messages never mix with the parent's."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpirun import TESTS, run_mpi
from split_mpi import check_group, check_splits

from fast_core import LocalCluster
from fast_core.engine import Engine
from fast_core.engine.metered import MeteredEngine
from fast_core.engine.mpi_ft import FaultTolerantMPIEngine
from fast_core.errors import PeerFailed
from fast_core.metrics import Metrics


def test_local_groups_by_parity_and_by_halves_each_sum_only_their_own_values() -> None:
    LocalCluster(6, timeout=30).run(check_splits)


def test_a_color_of_its_own_gives_a_group_of_one_and_uneven_groups_work() -> None:
    LocalCluster(5, timeout=30).run(lambda engine: check_group(engine, lambda r: 0 if r < 4 else 9))


def test_a_failure_in_the_parent_stops_a_rank_waiting_in_its_group() -> None:
    def body(engine) -> None:
        sub = engine.split(engine.rank % 2)
        if engine.rank == 3:
            raise KeyError("rank 3 broke")
        try:
            sub.allreduce(np.ones(1))  # rank 1 waits for rank 3, which is gone
        except PeerFailed:
            assert engine.rank == 1

    start = time.monotonic()
    with pytest.raises(KeyError, match="rank 3 broke"):
        LocalCluster(4, timeout=30).run(body)
    assert time.monotonic() - start < 10


def test_a_metered_engine_splits_into_a_metered_engine_counting_into_the_same_metrics() -> None:
    def body(engine) -> tuple[type, int]:
        metrics = Metrics()
        sub = MeteredEngine(engine, metrics).split(engine.rank // 2)
        payload = np.arange(4, dtype=np.float64)
        if sub.rank == 0:
            sub.wait(sub.isend(payload, 1, tag=3))
        else:
            got = np.zeros(4)
            sub.wait(sub.irecv(got, 0, tag=3))
            assert np.array_equal(got, payload)
        return type(sub), metrics.bytes_sent + metrics.bytes_received

    results = LocalCluster(4, timeout=30).run(body)
    assert results == [(MeteredEngine, 32)] * 4


@pytest.mark.parametrize("color", [-1, 1.5, True, "a"])
def test_a_color_that_is_not_an_int_of_at_least_zero_is_refused(color) -> None:
    with pytest.raises(ValueError, match="split color"):
        LocalCluster(1, timeout=5).engine(0).split(color)


def test_fault_tolerant_engines_and_engines_without_split_refuse_clearly() -> None:
    with pytest.raises(NotImplementedError, match="fault-tolerant LocalCluster cannot split"):
        LocalCluster(1, timeout=5, fault_tolerant=True).engine(0).split(0)
    ulfm = object.__new__(FaultTolerantMPIEngine)  # no ULFM here: only the refusal is checked
    ulfm.rank = 0
    with pytest.raises(NotImplementedError, match="without --fault-tolerant"):
        ulfm.split(0)
    with pytest.raises(NotImplementedError, match="cannot split into groups"):
        Engine.split(LocalCluster(1, timeout=5).engine(0), 0)  # the protocol's default


@pytest.mark.mpi
def test_mpi_groups_by_parity_and_by_halves_on_four_ranks() -> None:
    out = run_mpi(4, TESTS / "split_mpi.py", timeout=120)
    assert "split ok on 4 ranks" in out, out
