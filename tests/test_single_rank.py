"""On one rank every strategy is plain SGD: what a script started without a launcher gets."""

from __future__ import annotations

import numpy as np
import pytest
from training import CLASSES, FEATURES, LR, batch, task

from fast_core import LocalCluster, Worker, make_strategy
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies import SGP

ALL = [
    "allreduce",
    "localsgd:period=2",
    "dpsgd:ring",
    "dpsgd:exp1,every=2,warmup=3",
    "sgp",
    "fast:torus",
    "fast:torus,synchronous=true",
    "async:torus,staleness=1",
    "adpsgd:ring",
    "easgd:tau=2",
    "easgd:tau=2,synchronous=false",
    "gossip",
    "gossip:push",
    "gossip:synchronous=false",
    "gossip:push,synchronous=false",
    "ps",
    "ps:mode=async",
]


def train_next_to_plain_sgd(strategy) -> tuple[SoftmaxRegression, SoftmaxRegression, Worker]:
    """Ten steps with ``strategy`` on a one-rank cluster, and the same ten of plain SGD beside it."""
    x, y, shards, _ = task(1)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=0)
    alone = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=0)
    worker = Worker(model, strategy, LocalCluster(1, timeout=10).engine(0)).start()
    for step in range(10):
        for m in (model, alone):
            m.compute_gradients(*batch(x, y, shards[0], step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
        alone.optimizer_step()
    worker.close()
    return model, alone, worker


@pytest.mark.parametrize("spec", ALL)
def test_one_rank_is_plain_sgd(spec: str) -> None:
    model, alone, worker = train_next_to_plain_sgd(make_strategy(spec))
    np.testing.assert_allclose(model.params(), alone.params(), rtol=0, atol=1e-12)
    assert worker.metrics.messages_sent == worker.metrics.messages_received == 0
    assert worker.metrics.steps == 10


def test_sgp_alone_keeps_all_its_mass() -> None:
    sgp = SGP()
    _, alone, _ = train_next_to_plain_sgd(sgp)
    np.testing.assert_array_equal(sgp.numerator, alone.params())
    assert sgp.weight == 1.0
