"""fast_torch.save_checkpoint / load_checkpoint on in-process clusters: saved on 4 ranks, resumed on 2 and 8 with
the consensus model and the averaged optimizer state (SGD momentum, Adam moments); under async averaging a
loaded checkpoint is not pulled back toward the start parameters (issue 13, point 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fast_torch as fast
from fast_core import LocalCluster

FEATURES, CLASSES = 6, 3
OPTIMIZERS = {
    "sgd-momentum": lambda params, lr=0.05: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "adam": lambda params, lr=0.01: torch.optim.Adam(params, lr=lr, betas=(0.8, 0.99)),
}


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, CLASSES)
    ).double()


def train(model, opt, rank: int, steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(16, FEATURES, generator=g, dtype=torch.float64)
        y = torch.randint(0, CLASSES, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def optimizer_arrays(opt) -> dict[str, np.ndarray]:
    state = opt.state_dict()["state"]
    return {f"{i}/{k}": v.detach().numpy().copy() for i, s in state.items() for k, v in s.items()}


def _save(engine, path: str, kind: str):
    model = make_model(engine.rank)
    opt = fast.DistributedOptimizer(OPTIMIZERS[kind](model.parameters()), model, "dpsgd:ring", engine=engine)
    train(model, opt, engine.rank, 4)
    fast.save_checkpoint(path, model, opt)
    params = opt.fast_worker.model.params().copy()
    buffers = model[1].running_mean.detach().numpy().copy()
    opt.fast_worker.close()
    return params, optimizer_arrays(opt), buffers


def _load(engine, path: str, kind: str):
    model = make_model(100 + engine.rank)
    opt = fast.DistributedOptimizer(OPTIMIZERS[kind](model.parameters(), lr=0.5), model, "allreduce", engine=engine)
    loaded = fast.load_checkpoint(path, model, opt)
    out = (
        opt.fast_worker.model.params().copy(),
        optimizer_arrays(opt),
        model[1].running_mean.detach().numpy().copy(),
        opt.fast_worker.step,
        opt.param_groups[0]["lr"],
        loaded.header["ranks"],
    )
    train(model, opt, engine.rank, 1)  # the restored state steps on
    opt.fast_worker.close()
    return out


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_saved_on_four_ranks_it_resumes_on_two_and_eight_with_the_optimizer_state(tmp_path, kind: str) -> None:
    path = str(tmp_path / "torch.ckpt")
    saved = LocalCluster(4, timeout=120).run(_save, path, kind)
    mean = np.mean([p for p, _, _ in saved], axis=0)
    mean_state = {k: np.mean([s[k] for _, s, _ in saved], axis=0) for k in saved[0][1]}
    mean_buffer = np.mean([b for _, _, b in saved], axis=0)
    assert mean_state and not np.allclose(saved[0][0], saved[1][0])
    for size in (2, 8):
        for params, state, buffer, step, lr, ranks in LocalCluster(size, timeout=120).run(_load, path, kind):
            np.testing.assert_allclose(params, mean, rtol=0, atol=1e-12)
            assert state.keys() == mean_state.keys()
            for key, value in state.items():
                np.testing.assert_allclose(value, mean_state[key], rtol=1e-6, atol=1e-12, err_msg=key)
            np.testing.assert_allclose(buffer, mean_buffer, rtol=0, atol=1e-12)
            assert step == 4 and ranks == 4
            assert lr == OPTIMIZERS[kind].__defaults__[0]  # the saved hyper-parameters, not the new optimizer's


def _ones(engine, path: str) -> None:
    model = make_model(0)
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model, "allreduce", engine=engine)
    opt.fast_worker.model.params()[:] = 1.0
    fast.save_checkpoint(path, model, opt)
    opt.fast_worker.close()


def _async_lr0(engine, path: str, strategy: str) -> np.ndarray:
    model = make_model(7 + engine.rank)
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model, strategy, engine=engine)
    fast.load_checkpoint(path, model, opt)  # after setup posted the start parameters
    model.eval()  # BatchNorm's statistics stay as loaded; only the parameters are checked
    train(model, opt, engine.rank, 30)
    opt.fast_worker.close()
    return opt.fast_worker.model.params().copy()


@pytest.mark.parametrize("strategy", ["async:ring", "async:ring,keep_progress=false"])
def test_a_checkpoint_loaded_after_distributed_optimizer_under_async_is_not_pulled_to_the_start(
    tmp_path, strategy
) -> None:
    path = str(tmp_path / "ones.ckpt")
    LocalCluster(2, timeout=120).run(_ones, path)  # saved with lr 0: load restores the saved hyper-parameters
    for params in LocalCluster(4, timeout=120).run(_async_lr0, path, strategy):
        np.testing.assert_allclose(params, 1.0, rtol=0, atol=1e-12)
