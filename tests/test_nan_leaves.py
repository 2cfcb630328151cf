"""A rank whose parameters turn NaN in a fault-tolerant job leaves it, and the others finish with a finite model
(fast_core.runtime.survival.leave); without fault tolerance the job still ends with the error naming the rank.
In-process here; a NaN injected with SIGUSR1 under Open MPI with ULFM in tests/test_growth_mpi.py."""

from __future__ import annotations

import numpy as np
import pytest

from fast_core import Budget, LocalCluster, Worker
from fast_core.data.datasets import batches, shard_indices, synthetic_classification
from fast_core.engine.capabilities import world_ranks
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.observers.fault_injection import NaNOnSignal
from fast_core.strategies.integrity import NonFiniteError

BATCH, BUDGET, POISONED_AT, VICTIM = 16, 8_000, 20, 2
X, Y = synthetic_classification(n_samples=1200, n_features=10, n_classes=3, seed=0)


def train(engine, strategy: str, at_the_end: bool = False) -> dict:
    """Train under a shared budget; the victim's parameters turn NaN at step POISONED_AT, or ``at_the_end``: after
    its last step, before the consensus model is computed (no own check comes in between)."""
    model = SoftmaxRegression(X.shape[1], 3, seed=engine.rank)
    injector = NaNOnSignal(model.params, model.set_params)
    worker = Worker(model, strategy, engine, observers=[injector], budget=Budget(samples=BUDGET)).start()
    shard = shard_indices(len(Y), engine.rank, engine.size)
    for epoch in range(1000):
        for xb, yb in batches(X[shard], Y[shard], BATCH, epoch=epoch, seed=engine.rank):
            victim = world_ranks(engine)[engine.rank] == VICTIM
            if victim and worker.step == POISONED_AT and not at_the_end:
                injector.inject()  # as SIGUSR1 does under FAST_INJECT_FAULTS=1
            granted = worker.claim_batch(BATCH)
            if granted == 0:
                worker.close()
                if victim and at_the_end:
                    model.set_params(np.full_like(model.params(), np.nan))
                consensus = worker.group.average_params()
                accuracy = model.accuracy(X, Y, params=consensus)
                return {"size": engine.size, "finite": bool(np.isfinite(consensus).all()), "accuracy": accuracy}
            model.compute_gradients(xb[:granted], yb[:granted])
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
    raise AssertionError("the budget never ended")


@pytest.mark.parametrize("strategy", ["dpsgd:ring", "allreduce", "async:ring"])
def test_a_rank_whose_parameters_turn_nan_leaves_and_the_others_finish(strategy: str) -> None:
    cluster = LocalCluster(4, timeout=30, fault_tolerant=True)
    results = cluster.run(train, strategy)
    assert list(cluster.lost) == [VICTIM] and isinstance(cluster.lost[VICTIM], NonFiniteError)
    assert "hold NaN or Inf" in str(cluster.lost[VICTIM])
    survivors = [r for r in results if r is not None]
    assert len(survivors) == 3 and all(r["size"] == 3 and r["finite"] for r in survivors)
    assert all(r["accuracy"] > 0.8 for r in survivors)


def test_a_nan_born_after_the_last_check_leaves_with_its_rank_and_the_consensus_is_computed_again() -> None:
    cluster = LocalCluster(4, timeout=30, fault_tolerant=True)
    results = cluster.run(train, "dpsgd:ring", True)
    assert list(cluster.lost) == [VICTIM] and "the consensus model holds NaN" in str(cluster.lost[VICTIM])
    survivors = [r for r in results if r is not None]
    assert len(survivors) == 3 and all(r["size"] == 3 and r["finite"] and r["accuracy"] > 0.8 for r in survivors)


def test_without_fault_tolerance_the_nan_still_ends_the_job_naming_the_rank() -> None:
    with pytest.raises(NonFiniteError, match=f"rank {VICTIM}'s"):
        LocalCluster(4, timeout=30).run(train, "dpsgd:ring")
