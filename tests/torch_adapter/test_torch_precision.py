"""fast_torch with parameters in float16/bfloat16 or of several dtypes (issue 14, point 1): mixed through host
copies in float32 and written back in each parameter's own dtype, staged only on steps where the strategy mixes,
never trusted across a user's edit. On this CPU-only machine the staging code runs with the CPU as the device; the
CUDA test runs where a GPU is present (it pins the host buffers and copies on a side stream)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fast_torch as fast
from fast_core import LocalCluster
from fast_core.topology import make_topology

SIZE, FEATURES, CLASSES, STEPS, LR = 4, 6, 3, 5, 0.2


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, FEATURES, generator=g), torch.randint(0, CLASSES, (16,), generator=g)


def make_model(dtypes: tuple[torch.dtype, torch.dtype], seed: int = 0) -> torch.nn.Module:
    """Weights from a generator of its own (ranks are threads here: the global seed would be shared)."""
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 5), torch.nn.Linear(5, CLASSES))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(0.5 * torch.randn(param.shape, generator=g))
    return torch.nn.Sequential(model[0].to(dtypes[0]), model[1].to(dtypes[1]))


def local_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    opt.zero_grad()
    out = model[1](model[0](x.to(model[0].weight.dtype)).to(model[1].weight.dtype))
    torch.nn.functional.cross_entropy(out.float(), y).backward()
    opt.step()


def _train(engine, dtypes, strategy: str) -> list[torch.Tensor]:
    model = make_model(dtypes, seed=engine.rank)  # rank 0's start reaches every rank
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model, strategy, engine=engine)
    for step in range(STEPS):
        local_step(model, opt, engine.rank, step)
    opt.fast_worker.close()
    return [p.detach().clone() for p in model.parameters()]


def reference_dpsgd(dtypes, mix: bool = True) -> list[list[torch.Tensor]]:
    """D-PSGD on a ring of SIZE in one process: each rank's own step in its dtypes, then x_i <- x_i + (w_ii - 1)
    s_i + sum_j w_ij s_j in float32 (s: the parameters at the start of the step), cast back to each dtype."""
    graph = make_topology("ring", SIZE)
    models = [make_model(dtypes, seed=0) for _ in range(SIZE)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    for step in range(STEPS):
        starts = [[p.detach().float().clone() for p in m.parameters()] for m in models]
        for rank, (model, opt) in enumerate(zip(models, opts, strict=True)):
            local_step(model, opt, rank, step)
        if not mix:
            continue
        mixed = []
        for rank, model in enumerate(models):
            out = []
            for k, param in enumerate(model.parameters()):
                value = param.detach().float() + (graph.self_weight(rank, step) - 1.0) * starts[rank][k]
                for peer, weight in graph.in_weights(rank, step).items():
                    value = value + weight * starts[peer][k]
                out.append(value.to(param.dtype))
            mixed.append(out)
        with torch.no_grad():
            for model, values in zip(models, mixed, strict=True):
                for param, value in zip(model.parameters(), values, strict=True):
                    param.copy_(value)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


@pytest.mark.parametrize(
    "dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float32, torch.float64)]
)
def test_dpsgd_mixes_in_float32_and_writes_back_each_dtype(dtypes) -> None:
    results = LocalCluster(SIZE, timeout=30).run(_train, dtypes, "dpsgd:ring")
    expected, unmixed = reference_dpsgd(dtypes), reference_dpsgd(dtypes, mix=False)
    low = dtypes[0] in (torch.float16, torch.bfloat16)
    tolerance = {"rtol": 1.6e-2, "atol": 2e-3} if low else {"rtol": 1e-5, "atol": 1e-6}
    for got, want, alone in zip(results, expected, unmixed, strict=True):
        assert [p.dtype for p in got] == [dtypes[0]] * 2 + [dtypes[1]] * 2  # each parameter kept its own dtype
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, **tolerance)
        gap = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, alone, strict=True))
        assert gap > 10 * tolerance["atol"]  # the mixing is visible: without it the numbers are elsewhere


def test_allreduce_of_bfloat16_gradients_keeps_every_rank_identical() -> None:
    dtypes = (torch.bfloat16, torch.bfloat16)
    results = LocalCluster(SIZE, timeout=30).run(_train, dtypes, "allreduce")
    model = make_model(dtypes)  # one process, the mean of the ranks' gradients (float32) each step
    for step in range(STEPS):
        grads = []
        for rank in range(SIZE):
            model.zero_grad()
            x, y = batch(rank, step)
            torch.nn.functional.cross_entropy(model(x.bfloat16()).float(), y).backward()
            grads.append([p.grad.float().clone() for p in model.parameters()])
        with torch.no_grad():
            for k, param in enumerate(model.parameters()):
                mean = sum(g[k] for g in grads) / SIZE
                param.sub_(LR * mean.to(param.dtype))
    for got in results:
        for a, b, first in zip(got, model.parameters(), results[0], strict=True):
            assert a.dtype == torch.bfloat16
            torch.testing.assert_close(a, first, rtol=0, atol=0)
            torch.testing.assert_close(a, b.detach(), rtol=1.6e-2, atol=2e-3)


class CountingGroups:
    """Counts the host <-> device copies of a staged model."""

    def __init__(self, groups) -> None:
        self.inner, self.to_host_calls, self.to_device_calls = groups, 0, 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def to_host(self, sources, host) -> None:
        self.to_host_calls += 1
        self.inner.to_host(sources, host)

    def to_device(self, host, targets) -> None:
        self.to_device_calls += 1
        self.inner.to_device(host, targets)


def test_a_step_where_the_strategy_does_not_mix_stages_nothing() -> None:
    model = make_model((torch.bfloat16, torch.bfloat16))
    engine = LocalCluster(1).engine(0)
    opt = fast.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), model, "dpsgd:ring,every=3", engine=engine
    )
    adapter = opt.fast_worker.model
    assert adapter.staged
    adapter.groups = counter = CountingGroups(adapter.groups)
    copies = []
    for step in range(6):
        local_step(model, opt, 0, step)
        copies.append((counter.to_host_calls, counter.to_device_calls))
    # steps 3 and 6 mix: one read (the parameters after the step) and one write each; the others copy nothing
    assert copies == [(0, 0), (0, 0), (1, 1), (1, 1), (1, 1), (2, 2)]


def test_an_edit_between_steps_is_seen_by_the_next_read() -> None:
    model = make_model((torch.bfloat16, torch.bfloat16))
    opt = fast.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), model, "dpsgd:ring", engine=LocalCluster(1).engine(0)
    )
    local_step(model, opt, 0, 0)
    with torch.no_grad():
        model[0].weight.fill_(0.5)
    np.testing.assert_array_equal(opt.fast_worker.group.average_params()[: model[0].weight.numel()], 0.5)


def test_a_bfloat16_model_saves_and_resumes_a_checkpoint(tmp_path) -> None:
    path = str(tmp_path / "bf16.ckpt")

    def save(engine) -> list[torch.Tensor]:
        model = make_model((torch.bfloat16, torch.bfloat16), seed=engine.rank)
        opt = fast.DistributedOptimizer(
            torch.optim.Adam(model.parameters(), lr=0.01), model, "dpsgd:ring", engine=engine
        )
        local_step(model, opt, engine.rank, 0)
        fast.save_checkpoint(path, model, opt)
        opt.fast_worker.close()
        return [p.detach().float() for p in model.parameters()]

    saved = LocalCluster(2, timeout=30).run(save)
    mean = [(a + b) / 2 for a, b in zip(*saved, strict=True)]

    def load(engine) -> list[torch.Tensor]:
        model = make_model((torch.bfloat16, torch.bfloat16), seed=9)
        opt = fast.DistributedOptimizer(
            torch.optim.Adam(model.parameters(), lr=0.01), model, "allreduce", engine=engine
        )
        fast.load_checkpoint(path, model, opt)
        assert all(s["exp_avg"].dtype == torch.bfloat16 for s in opt.state.values())
        return [p.detach() for p in model.parameters()]

    for got in LocalCluster(3, timeout=30).run(load):
        for a, b in zip(got, mean, strict=True):
            assert a.dtype == torch.bfloat16
            torch.testing.assert_close(a.float(), b, rtol=1.6e-2, atol=2e-3)


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: the tests above run the same staging code with the CPU as the device",
)
def test_a_cuda_model_trains_async_torus_like_the_same_model_on_the_cpu() -> None:
    def run(engine, device: str) -> list[torch.Tensor]:
        model = make_model((torch.float32, torch.float32), seed=engine.rank).to(device)
        opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model, "dpsgd:ring", engine=engine)
        assert opt.fast_worker.model.staged == (device != "cpu")
        if device != "cpu":
            assert opt.fast_worker.model._host_params.is_pinned()
        for step in range(STEPS):
            x, y = batch(engine.rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
        opt.fast_worker.close()
        return [p.detach().cpu() for p in model.parameters()]

    on_gpu = LocalCluster(SIZE, timeout=60).run(run, "cuda")
    on_cpu = LocalCluster(SIZE, timeout=60).run(run, "cpu")
    for a_rank, b_rank in zip(on_gpu, on_cpu, strict=True):
        for a, b in zip(a_rank, b_rank, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
