"""Horovod's elastic training on FAST (``fast_core.interop.elastic``), in one process: ``ObjectState``'s commit,
restore and sync against expected values, and ``run`` on an in-process fault-tolerant cluster
(``LocalCluster(fault_tolerant=True)``, the stand-in for Open MPI with ULFM): a rank lost in mid-training, the
survivors re-form, restore the last commit, sync and finish with the weights one process computes.
tests/test_horovod_elastic_ft.py kills a real process under `fast run --fault-tolerant`."""

from __future__ import annotations

import horovod_elastic_script as script
import numpy as np
import pytest

import fast_core.interop.horovod as hvd
from fast_core import LocalCluster, PeerLost, Worker
from fast_core.interop.elastic import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, run, track
from fast_core.model.numpy_model import SoftmaxRegression


class Killed(Exception):
    """Raised by a rank to be lost (LocalCluster(fault_tolerant=True) loses a rank that raises): kill -9's stand-in."""


def die() -> None:
    raise Killed("killed by the test")


def one_rank():
    return LocalCluster(1).engine(0)


def test_restore_brings_back_the_last_commit_undoing_in_place_changes() -> None:
    state = ObjectState(fast_engine=one_rank(), epoch=0, history=[], w=np.zeros(3, np.float32), meta={"lr": 0.1})
    state.epoch, state.meta["lr"] = 1, 0.2
    state.history.append(1.5)
    state.w += 1
    state.commit()
    state.epoch = 2
    state.history.append(2.5)
    state.w += 1
    state.meta["lr"] = 0.4
    state.restore()
    assert (state.epoch, state.history, state.meta) == (1, [1.5], {"lr": 0.2})
    assert state.w.dtype == np.float32 and state.w.tolist() == [1.0, 1.0, 1.0]
    state.w += 5  # in place on the restored array: the commit stays as it was made
    state.history.append(9)
    state.restore()
    assert state.w.tolist() == [1.0, 1.0, 1.0] and state.history == [1.5]


def test_a_value_that_is_not_json_or_an_array_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match="attribute 'model' is a object: FAST syncs JSON data and NumPy arrays, never"):
        ObjectState(fast_engine=one_rank(), model=object())
    with pytest.raises(TypeError, match="attribute 'rows': an array of Python objects"):
        ObjectState(fast_engine=one_rank(), rows=np.array([object()]))


def _sync_values(engine):
    state = ObjectState(
        bcast_object=hvd.broadcast_object,  # Horovod's own arguments, accepted and unused
        get_rank=hvd.rank,
        fast_engine=engine,
        epoch=engine.rank,
        pair=(engine.rank, "x"),
        w=np.full(2, engine.rank, dtype=np.int16),
        nested={"lr": 0.1 * (engine.rank + 1)},
    )
    state.epoch = 10 + engine.rank  # not committed: the committed value travels, as under Horovod
    state.sync()
    return state.epoch, state.pair, state.w.dtype, state.w.tolist(), state.nested


def test_sync_gives_every_rank_the_values_rank_0_committed() -> None:
    results = LocalCluster(3, timeout=20).run(_sync_values)
    assert results == [(0, [0, "x"], np.int16, [0, 0], {"lr": 0.1})] * 3  # a tuple comes back a list (JSON)


def _sync_after_a_newcomer(engine):
    state = ObjectState(fast_engine=engine, epoch=engine.rank)
    state.sync()
    state.epoch = 5 + engine.rank
    state.commit()
    if engine.rank == 0:  # as a process started to replace rank 0 would: a state that was never synced
        state = ObjectState(fast_engine=engine, epoch=-1)
    state.sync()
    return state.epoch


def test_sync_comes_from_the_lowest_rank_that_held_the_state_never_from_a_newcomer() -> None:
    assert LocalCluster(3, timeout=20).run(_sync_after_a_newcomer) == [6, 6, 6]


@pytest.mark.parametrize(
    "victim",
    [(2, 1, 3), (0, 1, 3), (3, 0, 0)],
    ids=["rank2-rolls-back-a-batch", "rank0-syncs-from-the-next", "before-any-commit"],
)
def test_the_survivors_of_a_lost_rank_restore_resync_and_finish_with_one_process_weights(victim) -> None:
    cluster = LocalCluster(4, timeout=20, fault_tolerant=True)
    results = cluster.run(script.train_job, victim, die)
    survivors = [r for r in results if r is not None]
    assert list(cluster.lost) == [victim[0]] and len(survivors) == 3
    expected = script.reference()
    for result in survivors:
        assert result["size"] == 3 and result["resets"] == [3] and result["epoch"] == script.EPOCHS - 1
        np.testing.assert_allclose(result["w"], expected, rtol=0, atol=1e-12)  # every step applied exactly once


def _interrupted_at_commit(engine):
    worker = Worker(SoftmaxRegression(4, 2, seed=0), "allreduce", engine, observers=[]).start()
    track(worker)
    calls, resets = [], []
    state = ObjectState(fast_engine=engine, done=0)
    state.register_reset_callbacks([lambda: resets.append(engine.size)])

    @run
    def train(state):
        calls.append(state.done)
        if state.done == 0:
            if engine.rank == 2:
                die()
            worker.group.average_params()  # FAST survives the loss inside its own collective
            state.done = 1
            state.commit()  # the group changed meanwhile: HostsUpdatedInterrupt
            raise AssertionError("commit() did not raise HostsUpdatedInterrupt")
        return state.done

    return train(state), calls, resets, [r.lost for r in worker.group.recoveries]


def test_a_loss_fast_survived_by_itself_interrupts_at_the_next_commit_which_is_kept() -> None:
    results = LocalCluster(3, timeout=20, fault_tolerant=True).run(_interrupted_at_commit)
    assert results[2] is None
    assert results[:2] == [(1, [0, 1], [2], [(2,)])] * 2  # the commit made at the interrupt holds: done == 1


def test_run_takes_a_state_and_horovods_names_are_there() -> None:
    with pytest.raises(TypeError, match="takes the state first"):
        run(lambda state: None)(42)
    assert HorovodInternalError is PeerLost and issubclass(HostsUpdatedInterrupt, Exception)
    assert hvd.elastic.run is run and hvd.elastic.ObjectState is ObjectState
    assert "elastic" not in hvd.NOT_PROVIDED


def test_a_listing_that_names_an_object_array_is_refused() -> None:
    from fast_core.interop.elastic import _plain_dtype

    assert _plain_dtype("<f4", 0) == np.float32
    with pytest.raises(TypeError, match="rank 3 sent lists an array of Python objects"):
        _plain_dtype("|O", 3)
