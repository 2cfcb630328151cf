"""The in-process engine survives a lost rank (LocalCluster(fault_tolerant=True)): every survivor learns of the loss
as PeerLost, the survivors shrink to a working group with the same lost set, and without fault tolerance the job
still stops as before. Engine level only (no Worker)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from fast_core import LocalCluster, LocalEngine, PeerFailed, PeerLost, PeerTimeout
from fast_core.engine.capabilities import FaultTolerant, fault_tolerance, world_ranks
from fast_core.engine.metered import MeteredEngine
from fast_core.errors import FastError
from fast_core.metrics import Metrics


def until(condition: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    """Wait for ``condition`` (another thread's progress); fail naming ``what`` if it never holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {seconds} s waiting for {what}")
        time.sleep(0.001)


def ring(engine: LocalEngine, value: float, tag: int = 0) -> tuple[float, float]:
    """Send ``value`` to both ring neighbours; return what the left and the right one sent."""
    left, right = (engine.rank - 1) % engine.size, (engine.rank + 1) % engine.size
    got = [np.zeros(1), np.zeros(1)]
    engine.wait_all(engine.exchange(np.array([value]), [left, right], got, [left, right], tag))
    return float(got[0][0]), float(got[1][0])


def check_survivors_work(engine: LocalEngine) -> None:
    """Allreduce, broadcast, barrier, ibarrier and a ring exchange over the survivors give the right numbers."""
    launch = engine.world_ranks
    me = launch[engine.rank]
    values = {w: np.random.default_rng(w).standard_normal(5) for w in launch}
    buf = values[me].copy()
    engine.allreduce(buf)
    np.testing.assert_allclose(buf, np.sum([values[w] for w in launch], axis=0))
    low = values[me].copy()
    engine.allreduce(low, op="min", kind="job")
    np.testing.assert_array_equal(low, np.min([values[w] for w in launch], axis=0))
    root = engine.size - 1
    sent = values[me].copy()
    engine.broadcast(sent, root=root)
    np.testing.assert_array_equal(sent, values[launch[root]])
    engine.barrier()
    engine.wait(engine.ibarrier())
    left, right = ring(engine, float(me), tag=7)
    assert (left, right) == (launch[(engine.rank - 1) % engine.size], launch[(engine.rank + 1) % engine.size])


def test_a_rank_raising_under_a_ring_exchange_is_lost_and_the_survivors_shrink_and_go_on() -> None:
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> tuple[tuple[int, ...], tuple[int, ...], int, int]:
        assert isinstance(engine, FaultTolerant) and engine.world_ranks == (0, 1, 2, 3)
        for step in range(100):
            if engine.rank == 2 and step == 3:
                raise RuntimeError("rank 2 dies at step 3")
            try:
                assert ring(engine, float(engine.rank)) == ((engine.rank - 1) % 4, (engine.rank + 1) % 4)
            except PeerLost as exc:  # rank 0 never talks to rank 2 and learns of it all the same
                assert exc.ranks == (2,) and "RuntimeError: rank 2 dies" in str(exc)
                break
        else:
            raise AssertionError("no PeerLost after rank 2 was lost")
        assert step <= 4  # a survivor cannot get past the step after rank 2's last one
        lost = engine.shrink()
        check_survivors_work(engine)
        return lost, engine.world_ranks, engine.rank, engine.size

    results = cluster.run(body)
    assert results[2] is None
    assert [r for r in results if r is not None] == [((2,), (0, 1, 3), i, 3) for i in range(3)], cluster.lost
    assert list(cluster.lost) == [2] and isinstance(cluster.lost[2], RuntimeError)


def test_ranks_blocked_in_an_allreduce_are_woken_by_a_loss_and_the_lost_rank_calls_nothing_more() -> None:
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> tuple[int, ...] | None:
        if engine.rank == 3:  # lost once the others are all inside allreduce #1, waiting for it
            until(lambda: engine.cluster.missing(1) == (3,), "ranks 0-2 to enter the allreduce")
            cluster.lose(3)
            with pytest.raises(PeerFailed, match="launch rank 3 is lost") as refused:
                engine.allreduce(np.ones(2))
            assert not isinstance(refused.value, PeerLost)  # not told to shrink: a killed process does nothing
            return (-1,)  # dropped: a lost rank's result is None
        with pytest.raises(PeerLost, match=r"launch rank\(s\) \[3\]") as caught:
            engine.allreduce(np.ones(2))
        assert caught.value.ranks == (3,)
        lost = engine.shrink()
        check_survivors_work(engine)
        return lost

    assert cluster.run(body) == [(3,), (3,), (3,), None], cluster.lost
    assert isinstance(cluster.lost[3], PeerLost) and cluster.lost[3].ranks == (3,)


def test_after_a_loss_every_operation_of_the_group_raises_peer_lost_until_shrink() -> None:
    cluster = LocalCluster(3, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> tuple[int, ...]:
        if engine.rank == 1:
            raise ValueError("lost before any message")
        until(lambda: 1 in cluster.lost, "rank 1's loss")
        other = 2 - engine.rank  # the other survivor, never the lost rank
        operations = {
            "check_alive": engine.check_alive,
            "isend to a survivor": lambda: engine.isend(np.ones(1), other),
            "irecv from a survivor": lambda: engine.irecv(np.ones(1), other),
            "isend to the lost rank": lambda: engine.isend(np.ones(1), 1),
            "allreduce": lambda: engine.allreduce(np.ones(1)),
            "broadcast": lambda: engine.broadcast(np.ones(1)),
            "barrier": engine.barrier,
            "ibarrier": engine.ibarrier,
            "dup": engine.dup,
        }
        for name, operation in operations.items():
            with pytest.raises(PeerLost) as caught:
                operation()
            assert caught.value.ranks == (1,), name
        return engine.shrink()

    assert cluster.run(body) == [(1,), None, (1,)], cluster.lost


def test_two_successive_losses_shrink_four_to_three_to_two() -> None:
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> list[tuple[int, ...]]:
        metered = MeteredEngine(engine, Metrics())  # follows the inner engine through each shrink
        history = []
        for doomed in (1, 3):
            if engine.world_ranks[engine.rank] == doomed:
                raise RuntimeError(f"launch rank {doomed} dies")
            with pytest.raises(PeerLost) as caught:
                metered.allreduce(np.ones(3))
            assert caught.value.ranks == (doomed,)
            history.append(metered.shrink())
            assert (metered.rank, metered.size, metered.world_ranks) == (engine.rank, engine.size, engine.world_ranks)
            assert isinstance(metered, FaultTolerant)  # the wrapper has the capability of what it wraps
            check_survivors_work(engine)
        assert engine.world_ranks == (0, 2)
        return history

    assert cluster.run(body) == [[(1,), (3,)], None, [(1,), (3,)], None], cluster.lost
    assert list(cluster.lost) == [1, 3]


def test_a_comm_thread_engine_raises_peer_lost_stays_broken_after_shrink_and_a_new_dup_works() -> None:
    cluster = LocalCluster(3, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> tuple[int, ...]:
        comm = engine.dup()
        rounds = threading.Semaphore(0)
        errors: list[BaseException] = []

        def comm_thread() -> None:
            try:
                while True:
                    ring(comm, float(comm.rank))
                    rounds.release()
            except FastError as exc:
                errors.append(exc)

        thread = threading.Thread(target=comm_thread)
        thread.start()
        for _ in range(3):
            assert rounds.acquire(timeout=5)
        if engine.rank == 2:
            raise RuntimeError("rank 2 dies while its comm thread runs")
        thread.join(5)
        assert not thread.is_alive()
        assert isinstance(errors[0], PeerLost) and errors[0].ranks == (2,)
        with pytest.raises(PeerLost):  # the trainer learns of it at its next call, having sent nothing
            engine.check_alive()
        lost = engine.shrink()
        with pytest.raises(PeerLost):
            comm.barrier()
        with pytest.raises(PeerLost):
            comm.isend(np.ones(1), 1 - engine.rank)
        fresh = engine.dup()
        assert fresh.world_ranks == (0, 1) and isinstance(fresh, FaultTolerant)
        assert ring(fresh, 10.0 + engine.rank) == (11.0 - engine.rank,) * 2
        return lost

    results = cluster.run(body)
    assert results == [(2,), (2,), None], cluster.lost


def test_a_rank_lost_while_the_others_wait_in_shrink_is_excluded_from_the_same_shrink() -> None:
    """Rank 2 arrives in the shrink after rank 3's loss and is lost there before rank 1 arrives: nobody waits for
    it, and the survivors agree that this one shrink lost both."""
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def arrived() -> set[int]:
        return set() if cluster._shrink is None else set(cluster._shrink.arrived)

    def body(engine: LocalEngine) -> tuple[int, ...]:
        if engine.rank == 3:
            raise RuntimeError("first loss")
        with pytest.raises(PeerLost):
            engine.barrier()
        if engine.rank == 1:
            until(lambda: {0, 2} <= arrived(), "ranks 0 and 2 in the shrink")
            cluster.lose(2)
        lost = engine.shrink()  # rank 2's raises PeerFailed: it is lost
        assert engine.world_ranks == (0, 1)
        check_survivors_work(engine)
        return lost

    assert cluster.run(body) == [(2, 3), (2, 3), None, None], cluster.lost
    assert isinstance(cluster.lost[2], PeerLost) and isinstance(cluster.lost[3], RuntimeError)


def test_a_rank_lost_just_after_the_shrink_decided_revokes_the_new_group_and_a_second_shrink_follows() -> None:
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> list[tuple[int, ...]]:
        if engine.rank == 0:
            raise RuntimeError("first loss")
        with pytest.raises(PeerLost):
            engine.barrier()
        history = [engine.shrink()]
        if engine.world_ranks[engine.rank] == 2:
            raise RuntimeError("lost right after the shrink")
        with pytest.raises(PeerLost) as caught:
            engine.allreduce(np.ones(1))
        assert caught.value.ranks == (2,)
        history.append(engine.shrink())
        assert engine.world_ranks == (1, 3)
        check_survivors_work(engine)
        return history

    assert cluster.run(body) == [None, [(0,), (2,)], None, [(0,), (2,)]], cluster.lost


def test_what_a_rank_sent_before_its_loss_reaches_receives_posted_before_it_only() -> None:
    cluster = LocalCluster(3, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> list[float] | str:
        if engine.rank == 1:
            for tag in (1, 2, 3):
                engine.isend(np.array([float(tag)]), 0, tag)
            engine.isend(np.array([4.0]), 2, tag=4)
            engine.ibarrier()  # joined, then lost: the others' ibarrier and barrier can still complete
            engine.barrier()
            raise RuntimeError("lost after sending")
        if engine.rank == 2:
            joined = engine.ibarrier()
            engine.barrier()
            engine.wait(joined)
            with pytest.raises(PeerLost):
                engine.wait(engine.irecv(np.zeros(1), 0, tag=5))  # from a survivor that never sends it
            assert engine.shrink() == (1,)
            return "survived"
        boxes = [np.zeros(1) for _ in range(3)]
        first, second = engine.irecv(boxes[0], 1, tag=1), engine.irecv(boxes[1], 1, tag=2)
        joined = engine.ibarrier()
        engine.barrier()
        until(lambda: 1 in cluster.lost, "rank 1's loss")
        engine.wait(joined)
        engine.wait_all([first, second])  # sent before the loss, to receives posted before it
        with pytest.raises(PeerLost):
            engine.irecv(boxes[2], 1, tag=3)  # posted after the loss: its message stays undelivered
        assert engine.shrink() == (1,) and engine.size == 2
        return [float(b[0]) for b in boxes]

    assert cluster.run(body) == [[1.0, 2.0, 0.0], None, "survived"], cluster.lost


def test_a_survivor_that_never_comes_to_the_shrink_is_named_by_its_launch_rank() -> None:
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> str:
        short = engine.dup(timeout=0.3)  # its shrink waits 0.3 s
        if engine.rank == 0:
            raise RuntimeError("lost")
        if engine.rank == 2:
            return "absent"  # finished, not lost: the survivors wait for it in vain
        until(lambda: 0 in cluster.lost, "rank 0's loss")
        with pytest.raises(PeerTimeout, match=r"in shrink for launch rank\(s\) \[2\], survivors") as caught:
            short.shrink()
        assert caught.value.ranks == (2,)
        return "timed out"

    assert cluster.run(body) == [None, "timed out", "absent", "timed out"], cluster.lost


def test_a_collective_timeout_after_a_shrink_names_the_rank_and_its_launch_rank() -> None:
    cluster = LocalCluster(4, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> str:
        if engine.rank == 1:
            raise RuntimeError("lost")
        with pytest.raises(PeerLost):
            engine.barrier()
        engine.shrink()
        short = engine.dup(timeout=0.3)
        if engine.world_ranks[engine.rank] == 2:
            return "skipped"  # skips the barrier: it is rank 1 now
        with pytest.raises(PeerTimeout, match=r"barrier #1 for rank\(s\) \[1\] \(launch rank\(s\) \[2\]\)") as caught:
            short.barrier()
        assert caught.value.ranks == (1,)
        return "timed out"

    assert cluster.run(body) == ["timed out", None, "skipped", "timed out"], cluster.lost


def test_when_every_rank_is_lost_run_raises_the_first_loss() -> None:
    cluster = LocalCluster(2, timeout=5, fault_tolerant=True)

    def body(engine: LocalEngine) -> None:
        if engine.rank == 0:
            raise ValueError("the first loss")
        until(lambda: 0 in cluster.lost, "rank 0's loss")
        raise KeyError("the second")

    with pytest.raises(ValueError, match="the first loss"):
        cluster.run(body)
    assert list(cluster.lost) == [0, 1]


def test_without_fault_tolerance_a_failure_or_a_lost_rank_still_stops_the_job() -> None:
    def raising(engine: LocalEngine) -> None:
        assert not isinstance(engine, FaultTolerant) and world_ranks(engine) == (0, 1, 2)
        assert not isinstance(MeteredEngine(engine, Metrics()), FaultTolerant)
        if engine.rank == 1:
            raise RuntimeError("boom")
        with pytest.raises(PeerFailed) as caught:
            engine.allreduce(np.ones(1))
        assert not isinstance(caught.value, PeerLost)
        with pytest.raises(PeerFailed, match="cannot go on without a lost rank"):
            fault_tolerance(engine).shrink()
        raise caught.value

    cluster = LocalCluster(3, timeout=5)
    with pytest.raises(RuntimeError, match="boom"):
        cluster.run(raising)
    assert cluster.lost == {}

    killed = LocalCluster(2, timeout=5)

    def losing(engine: LocalEngine) -> None:
        if engine.rank == 1:
            killed.lose(1)
            return
        with pytest.raises(PeerFailed, match="rank 1 failed"):
            engine.barrier()

    with pytest.raises(PeerLost, match="rank 1 was lost"):
        killed.run(losing)


def test_lose_names_a_rank_that_does_not_exist() -> None:
    with pytest.raises(ValueError, match="rank 4 does not exist in a cluster of 4"):
        LocalCluster(4, timeout=5, fault_tolerant=True).lose(4)
