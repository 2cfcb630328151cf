"""Multi-rank cases of the parameter server ``ps`` (collected by cases.py): in-process on 1, 2 and 4 ranks, and
under mpiexec (``mpiexec -n 4 python -m mpi4py tests/run_cases.py ps``)."""

from __future__ import annotations

import numpy as np
from training import CLASSES, FEATURES, LR, batch, reference_mean_gradient, task, train

from fast_core import Worker, make_strategy
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression


def case_ps_sync_is_sgd_on_the_mean_gradient(engine: Engine) -> None:
    """Every worker ends at the parameters of one model trained on the mean gradient of all shards."""
    expected = reference_mean_gradient(engine.size, 15)
    for servers in sorted({1, max(1, engine.size // 2), engine.size}):
        model, _ = train(engine, f"ps:servers={servers}", steps=15)
        np.testing.assert_allclose(model.params(), expected, rtol=0, atol=1e-10)


def case_ps_async_servers_hold_the_start_minus_lr_over_n_times_every_gradient(engine: Engine) -> None:
    """Downpour's invariant, whatever the interleaving: the servers' shards put together are the start minus
    lr / N (the default scale) times the sum of every gradient any worker pushed."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    strategy = make_strategy(f"ps:servers={max(1, engine.size // 2)},mode=async")
    worker = Worker(model, strategy, engine).start()
    start = model.params().copy()
    gradients = np.zeros_like(start)
    for step in range(10 + 5 * engine.rank):  # ranks push different numbers of updates
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        gradients += model.grads()
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()  # once every rank closed, every update has landed
    servers = np.zeros_like(start)
    shard = strategy.server_shard()
    if shard is not None:
        lo, hi, values = shard
        servers[lo:hi] = values
    engine.allreduce(servers)
    engine.allreduce(gradients)
    np.testing.assert_allclose(servers, start - LR / engine.size * gradients, rtol=0, atol=1e-12)
