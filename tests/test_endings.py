"""Clear endings where survival is impossible (issue 13, point 5): a lost rank is named, a dead-peer diagnosis never
crashes, one in-process worker's exception stops the others at once, a stopped launch leaves no process behind.

Every fault here is real (an exception raised on one worker, a rank killed with SIGKILL). Time bounds are generous
(a loaded 2-core machine): they tell an ending at once from one after a timeout, never a speed.
"""

from __future__ import annotations

import threading
import time

import pytest
from mpirun import TESTS, run_mpi
from training import CLASSES, FEATURES, batch, task

from fast_core import LocalCluster, Worker
from fast_core.numpy_model import SGD, SoftmaxRegression


@pytest.mark.mpi
def test_the_mpi_diagnosis_of_a_timed_out_collective_names_ranks_and_never_crashes() -> None:
    out = run_mpi(3, TESTS / "endings_mpi.py", timeout=120)
    for check in ("ranks_in_other_collectives", "an_absent_rank", "a_timed_out_allreduce_names_the_rank"):
        assert f"{check} ok" in out, out


# the in-process engine: one worker's exception stops the others at once ------------------------------------------


class Broken(RuntimeError):
    """What the failing worker raises (a user's own error: it names no rank)."""


def _train_until_stopped(engine, strategy: str, failing: int, at_step: int) -> None:
    """Train with no end (60 s at most) until rank ``failing`` raises Broken at step ``at_step``."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.1), seed=engine.rank)
    worker = Worker(model, strategy, engine, observers=[]).start()
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        if engine.rank == failing and worker.step == at_step:
            raise Broken("the data loader broke")
        model.compute_gradients(*batch(x, y, shards[engine.rank], worker.step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()


def _communication_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fast-") and t.is_alive()]


@pytest.mark.parametrize(
    "strategy",
    ["allreduce", "dpsgd:ring", "async:ring", "adpsgd:ring", "gossip:synchronous=false", "easgd:synchronous=false"],
)
def test_one_workers_exception_stops_the_others_at_once_and_is_what_run_raises(strategy: str) -> None:
    began = time.monotonic()
    with pytest.raises(Broken, match="the data loader broke") as raised:
        LocalCluster(4, timeout=30).run(_train_until_stopped, strategy, 2, 20)
    assert time.monotonic() - began < 10, "the other workers waited (a timeout is 30 s) instead of stopping"
    assert any("raised on rank 2 of a LocalCluster of 4" in note for note in getattr(raised.value, "__notes__", []))
    deadline = time.monotonic() + 5
    while _communication_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _communication_threads(), "communication threads outlived the failed run"
