"""``fast_torch.horovod.elastic``: ``TorchState``'s commit, restore and sync of a model and its optimizer against
expected values; Horovod's elastic run on an in-process fault-tolerant cluster through a FAST DistributedOptimizer
(a rank lost in the optimizer's step: the survivors restore the last commit, model, momentum and step, and finish
with the weights one process computes); and Horovod's PyTorch elastic example in shape under `fast run -n 2`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fast_cli import check_elastic_example

import fast_torch
import fast_torch.horovod as hvd
from fast_core import LocalCluster
from fast_core.interop.elastic import ObjectState

HERE = Path(__file__).resolve().parent
EPOCHS, BATCHES, ROWS, COMMIT_EVERY = 3, 6, 12, 2
"""ROWS: each step's global batch, split evenly over 4 or 3 ranks, so the mean gradient is the same for both."""


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(EPOCHS * BATCHES * ROWS, 5, generator=generator)
    return x, x @ torch.arange(1.0, 6.0) + 0.1 * torch.randn(len(x), generator=generator)


def _rows(epoch: int, batch: int) -> torch.Tensor:
    order = torch.randperm(EPOCHS * BATCHES * ROWS, generator=torch.Generator().manual_seed(100 + epoch))
    return order[batch * ROWS : (batch + 1) * ROWS]


def _model() -> torch.nn.Module:
    """The same start on every call (its own generator: the cluster's threads share torch's global one)."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=generator))
    return model


def _sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x).squeeze(1) - y) ** 2).mean()


def _flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def _one_process() -> np.ndarray:
    model, (x, y) = _model(), _data()
    optimizer = _sgd(model)
    for epoch in range(EPOCHS):
        for batch in range(BATCHES):
            take = _rows(epoch, batch)
            optimizer.zero_grad()
            _loss(model, x[take], y[take]).backward()
            optimizer.step()
    return _flat(model)


class Killed(Exception):
    """Raised by the rank to lose (LocalCluster(fault_tolerant=True) loses a rank that raises)."""


def _elastic_job(engine, victim: tuple[int, int, int]):
    (x, y), model = _data(), _model()
    optimizer = fast_torch.DistributedOptimizer(_sgd(model), model, "allreduce", engine=engine)
    me, resets = engine.world_ranks[engine.rank], []
    state = hvd.elastic.TorchState(model, optimizer, fast_engine=engine, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: resets.append(engine.size)])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 - Horovod's own loop
            for batch in range(state.batch, BATCHES):
                if (me, state.epoch, batch) == victim:
                    raise Killed
                take = _rows(state.epoch, batch)[engine.rank :: engine.size]
                state.optimizer.zero_grad()
                _loss(state.model, x[take], y[take]).backward()
                state.optimizer.step()
                state.batch = batch + 1
                if state.batch % COMMIT_EVERY == 0:
                    state.commit()
            state.batch = 0

    train(state)
    worker = optimizer.fast_worker
    return engine.size, resets, worker.step, [r.lost for r in worker.group.recoveries], _flat(model)


def _run_with_a_loss(victim: tuple[int, int, int]) -> list:
    cluster = LocalCluster(4, timeout=20, fault_tolerant=True)
    survivors = [r for r in cluster.run(_elastic_job, victim) if r is not None]
    assert list(cluster.lost) == [victim[0]] and len(survivors) == 3
    return survivors


@pytest.mark.parametrize("victim", [(2, 1, 3), (0, 2, 1)], ids=["rank2-odd-batch", "rank0"])
def test_a_rank_lost_in_the_optimizers_step_rolls_the_survivors_back_to_the_commit(victim) -> None:
    expected = _one_process()
    for size, resets, step, lost, params in _run_with_a_loss(victim):
        assert size == 3 and resets == [3] and lost == [(victim[0],)]
        assert step == EPOCHS * BATCHES  # the step clock came back with the commit: every step counted once
        np.testing.assert_allclose(params, expected, rtol=0, atol=2e-5)


def test_without_the_restore_the_batch_after_the_commit_would_count_twice(monkeypatch) -> None:
    monkeypatch.setattr(ObjectState, "restore", lambda self: None)
    params = _run_with_a_loss((2, 1, 3))[0][-1]
    assert np.abs(params - _one_process()).max() > 1e-3


def test_commit_and_restore_bring_back_the_model_the_optimizer_and_the_values() -> None:
    (x, y), model = _data(), _model()
    optimizer = _sgd(model)
    state = hvd.elastic.TorchState(model, optimizer, fast_engine=LocalCluster(1).engine(0), epoch=0)

    def step() -> None:
        optimizer.zero_grad()
        _loss(model, x[:8], y[:8]).backward()
        optimizer.step()

    step()
    state.epoch = 1
    state.commit()
    committed = _flat(model)
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    step()
    optimizer.param_groups[0]["lr"] = 0.5
    state.epoch = 2
    state.restore()
    np.testing.assert_array_equal(_flat(model), committed)
    for p, buffer in zip(model.parameters(), momentum, strict=True):
        torch.testing.assert_close(optimizer.state[p]["momentum_buffer"], buffer, rtol=0, atol=0)
    assert state.epoch == 1 and optimizer.param_groups[0]["lr"] == 0.02
    step()  # the restored momentum is the optimizer's own, not the commit's: a second restore is the same
    state.restore()
    np.testing.assert_array_equal(_flat(model), committed)


def _sync_into_a_fresh_optimizer(engine):
    (x, y), model = _data(), _model()
    with torch.no_grad():
        model[0].bias.fill_(engine.rank)
    optimizer = _sgd(model)
    if engine.rank == 0:  # rank 0 trained a step: it has momentum; rank 1's optimizer has no state yet
        _loss(model, x[:8], y[:8]).backward()
        optimizer.step()
        optimizer.param_groups[0]["lr"] = 0.3
    state = hvd.elastic.TorchState(model, optimizer, fast_engine=engine, epoch=engine.rank)
    state.sync()
    buffers = [optimizer.state[p]["momentum_buffer"].numpy().copy() for p in model.parameters()]
    return _flat(model), buffers, optimizer.param_groups[0]["lr"], state.epoch


def test_sync_gives_every_rank_rank_0s_model_and_optimizer_state_no_step_needed() -> None:
    (params0, buffers0, lr0, epoch0), (params1, buffers1, lr1, epoch1) = LocalCluster(2, timeout=20).run(
        _sync_into_a_fresh_optimizer
    )
    np.testing.assert_array_equal(params0, params1)
    for mine, theirs in zip(buffers0, buffers1, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert (lr0, lr1, epoch0, epoch1) == (0.3, 0.3, 0, 0)


@pytest.mark.timeout(240)
def test_horovods_pytorch_elastic_example_shape_trains_under_fast_run(tmp_path: Path) -> None:
    check_elastic_example(HERE / "horovod_elastic_script.py", tmp_path / "run", epochs=4)
