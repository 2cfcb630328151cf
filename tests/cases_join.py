"""Multi-rank cases of the join protocol: ranks with uneven numbers of batches never hang (collected by cases.py)."""

from __future__ import annotations

import numpy as np
from training import CLASSES, FEATURES, batch, task

from fast_core import Worker
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression

LOCKSTEP = ["allreduce", "dpsgd:ring", "dpsgd:exp1", "sgp", "localsgd:period=2", "gossip", "easgd:tau=2"]


def _train_uneven(engine: Engine, strategy: str) -> tuple[SoftmaxRegression, Worker, int]:
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.2), seed=engine.rank)
    worker = Worker(model, strategy, engine).start()
    worker.uneven_inputs = True
    for step in range(5 + 2 * engine.rank):  # the last rank has the most data
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    shadowed = worker.join()
    worker.close()
    return model, worker, shadowed


def case_join_lets_uneven_ranks_finish_every_lockstep_strategy(engine: Engine) -> None:
    longest = 5 + 2 * (engine.size - 1)
    for strategy in LOCKSTEP:
        model, worker, shadowed = _train_uneven(engine, strategy)
        assert shadowed == longest - (5 + 2 * engine.rank), (strategy, shadowed)
        assert worker.step == longest, (strategy, worker.step)
        if strategy == "allreduce":  # joined ranks applied the same mean gradients: still identical
            low, high = model.params().copy(), model.params().copy()
            engine.allreduce(low, op="min")
            engine.allreduce(high, op="max")
            np.testing.assert_array_equal(low, high)


def case_join_is_free_for_asynchronous_strategies(engine: Engine) -> None:
    for strategy in ("async:ring", "adpsgd:ring", "gossip:synchronous=false"):
        _, worker, shadowed = _train_uneven(engine, strategy)
        assert shadowed == 0 and worker.step == 5 + 2 * engine.rank, (strategy, shadowed, worker.step)
