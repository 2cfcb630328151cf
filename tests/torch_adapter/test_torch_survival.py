"""fast_torch under a lost rank: the survivors of an in-process fault-tolerant cluster train on through
DistributedOptimizer, and a live rank's optimizer state reaches a replacement whole (what fast_core.runtime.survival
sends over MPI under `fast run --max-restarts`)."""

from __future__ import annotations

import numpy as np
import pytest
from test_torch_checkpoint import OPTIMIZERS, make_model, optimizer_arrays, train

import fast_torch as fast
from fast_core import LocalCluster


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_a_live_ranks_optimizer_state_loads_into_a_fresh_optimizer(kind: str) -> None:
    engine = LocalCluster(1).engine(0)
    model = make_model(0)
    opt = fast.DistributedOptimizer(OPTIMIZERS[kind](model.parameters()), model, "allreduce", engine=engine)
    train(model, opt, 0, 3)
    fresh_model = make_model(1)
    fresh = fast.DistributedOptimizer(
        OPTIMIZERS[kind](fresh_model.parameters(), lr=0.5), fresh_model, "allreduce", engine=LocalCluster(1).engine(0)
    )
    state = opt.fast_worker.model.optimizer_state()
    assert state and all(isinstance(a, np.ndarray) for a in state.values())
    fresh.fast_worker.model.load_optimizer_state(state)
    theirs, mine = optimizer_arrays(opt), optimizer_arrays(fresh)
    assert theirs.keys() == mine.keys()
    for name in theirs:
        np.testing.assert_array_equal(theirs[name], mine[name])
    assert fresh.param_groups[0]["lr"] == 0.5  # the hyper-parameters stay the replacement's own


def _train_through_a_loss(engine, cluster: LocalCluster, strategy: str):
    model = make_model(engine.rank)
    opt = fast.DistributedOptimizer(OPTIMIZERS["sgd-momentum"](model.parameters()), model, strategy, engine=engine)
    worker = opt.fast_worker
    launched_as = engine.rank
    while worker.step < 15:  # by the step, not by a count of this rank's own: a recovery may move the step on
        if launched_as == 2 and worker.step == 5:
            cluster.lose(2)
            return None
        train(model, opt, launched_as, 1)
    fast.average_model(model)
    return engine.size, [r.lost for r in worker.group.recoveries], opt.fast_worker.model.params().copy()


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd:ring", "async:ring"])
def test_the_survivors_of_a_lost_rank_train_on_through_the_optimizer_wrapper(strategy: str) -> None:
    cluster = LocalCluster(4, timeout=20, fault_tolerant=True)
    results = cluster.run(_train_through_a_loss, cluster, strategy)
    survivors = [r for r in results if r is not None]
    assert len(survivors) == 3 and list(cluster.lost) == [2]
    for size, lost, params in survivors:
        assert size == 3 and lost == [(2,)] and np.all(np.isfinite(params))
        np.testing.assert_allclose(params, survivors[0][2], rtol=0, atol=1e-12)  # one consensus model
