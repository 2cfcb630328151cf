"""The nonblocking all-reduce on the in-process engine: a rank that fails or is lost stops the others' wait at once
(not at the timeout), and the metered engine counts it as an all-reduce. (Its numbers and its timeout, in-process
and under mpiexec: tests/cases_core.py.)"""

from __future__ import annotations

import time

import numpy as np
import pytest

from fast_core import LocalCluster
from fast_core.engine.metered import MeteredEngine
from fast_core.errors import PeerFailed, PeerLost, PeerTimeout
from fast_core.metrics import Metrics


def test_a_rank_that_never_joins_is_named_within_the_timeout() -> None:
    def run(engine):
        if engine.rank == 2:
            return None
        start = time.monotonic()
        with pytest.raises(PeerTimeout) as caught:
            engine.wait(engine.iallreduce(np.ones(5), kind="parameters"))
        seconds = time.monotonic() - start
        with pytest.raises(PeerTimeout) as barrier:  # a nonblocking barrier's wait names it too
            engine.wait(engine.ibarrier())
        return caught.value.ranks, str(caught.value), seconds, barrier.value.ranks

    for result in LocalCluster(3, timeout=0.5).run(run)[:2]:
        ranks, text, seconds, barrier = result
        assert ranks == (2,) and "parameters allreduce(sum) #1 (missing rank(s) [2])" in text, text
        assert 0.5 <= seconds < 5.0 and barrier == (2,)


def test_a_failed_rank_stops_the_wait_with_peer_failed_not_at_the_timeout() -> None:
    seen: dict[int, tuple[type, float]] = {}

    def run(engine):
        if engine.rank == 1:
            time.sleep(0.2)
            raise RuntimeError("rank 1 crashed")
        start = time.monotonic()
        try:
            engine.wait(engine.iallreduce(np.ones(4)))
        except PeerFailed as exc:
            seen[engine.rank] = (type(exc), time.monotonic() - start)
            raise

    with pytest.raises(RuntimeError, match="rank 1 crashed"):
        LocalCluster(3, timeout=60).run(run)
    assert set(seen) == {0, 2} and all(seconds < 5.0 for _, seconds in seen.values()), seen


def test_a_lost_rank_raises_peer_lost_unless_every_rank_had_joined() -> None:
    """As a barrier under revocation (local.py): posted by all before the loss, it completes; else PeerLost."""
    cluster = LocalCluster(3, timeout=60, fault_tolerant=True)

    def run(engine):
        joined = np.full(2, float(engine.rank))
        early = engine.iallreduce(joined)
        late = engine.iallreduce(np.ones(2), kind="job") if engine.rank != 2 else None  # rank 2 never joins it
        engine.barrier()
        if engine.rank == 2:
            cluster.lose(2)
            return None
        engine.wait(early)
        with pytest.raises(PeerLost) as caught:
            engine.wait(late)
        return joined, caught.value.ranks

    results = cluster.run(run)
    assert results[2] is None
    for joined, lost in results[:2]:
        np.testing.assert_array_equal(joined, np.full(2, 3.0))
        assert lost == (2,)


def test_metering_counts_its_bytes_when_posted_and_its_wait_when_waited() -> None:
    def run(engine):
        blocking, overlapped = Metrics(), Metrics()
        MeteredEngine(engine, blocking).allreduce(np.ones(1000))
        metered = MeteredEngine(engine, overlapped)
        if engine.rank == 0:
            time.sleep(0.3)  # the others wait for rank 0 to join, in their wait
        request = metered.iallreduce(np.ones(1000))
        posted = (overlapped.bytes_sent, overlapped.wait_seconds)
        metered.wait(request)
        return blocking.bytes_sent, posted, overlapped.wait_seconds

    for rank, (blocking, posted, waited) in enumerate(LocalCluster(4, timeout=30).run(run)):
        assert posted == (blocking, 0.0) and blocking == 2 * 8000 * 3 // 4
        assert waited >= 0.2 if rank else waited < 0.2, (rank, waited)
