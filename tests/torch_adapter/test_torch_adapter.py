"""fast_torch on one process: zero-copy views, the adapter contract through a real optimizer, checkpoints, errors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from diloco_reference import DiLoCoReference

import fast_torch as fast
from fast_core import LocalCluster
from fast_core.topology import make_topology

FEATURES, CLASSES, LR, STEPS = 6, 3, 0.1, 8


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 5), torch.nn.Tanh(), torch.nn.Linear(5, CLASSES)).double()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, FEATURES, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (16,), generator=g)


def one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_parameters_and_gradients_are_views_of_the_flat_buffer() -> None:
    model = make_model()
    opt = fast.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), model, "allreduce", engine=LocalCluster(1).engine(0)
    )
    worker = opt.fast_worker
    flat = worker.model.params()
    for param in model.parameters():
        assert np.shares_memory(flat, param.detach().numpy())
    for step in range(3):
        one_step(model, opt, 0, step)
        grads = worker.model.grads()
        for param in model.parameters():
            assert np.shares_memory(grads, param.grad.numpy())  # restored after zero_grad(set_to_none=True)
    before = flat.copy()
    flat += 1.0  # writing the buffer is writing the model
    np.testing.assert_array_equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy(), before + 1)


def _run_recording(engine, strategy: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    model = make_model(seed=engine.rank)  # different inits: the wrapper must broadcast rank 0's
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model, strategy, engine=engine)
    adapter = opt.fast_worker.model
    start = adapter.params().copy()
    grads = []
    for step in range(STEPS):
        x, y = batch(engine.rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append(adapter.grads().copy())  # what the strategy sees, before the step
        opt.step()
    opt.fast_worker.close()
    return start, adapter.params().copy(), grads


def test_dpsgd_through_the_optimizer_matches_the_numpy_reference() -> None:
    size = 4
    results = LocalCluster(size, timeout=30).run(_run_recording, "dpsgd:ring")
    starts = np.stack([r[0] for r in results])
    np.testing.assert_array_equal(starts, np.broadcast_to(starts[0], starts.shape))  # same start everywhere
    graph = make_topology("ring", size)
    states = starts.copy()
    for step in range(STEPS):
        states = graph.mixing_matrix(step) @ states - LR * np.stack([r[2][step] for r in results])
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], states[rank], rtol=0, atol=1e-12)


def test_diloco_through_the_string_matches_the_numpy_reference() -> None:
    results = LocalCluster(4, timeout=30).run(_run_recording, "diloco:period=2")
    starts = np.stack([r[0] for r in results])
    states = DiLoCoReference(period=2).replay(starts, [r[2] for r in results], LR)
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], states[rank], rtol=0, atol=1e-12)


def test_fast_applies_neighbour_gradients_through_the_optimizer() -> None:
    size = 4
    results = LocalCluster(size, timeout=30).run(_run_recording, "fast:torus,synchronous=true")
    graph = make_topology("torus", size)
    states = np.stack([r[0] for r in results])
    for step in range(STEPS):
        grads = [r[2][step] for r in results]
        for rank in range(size):
            states[rank] -= LR * (grads[rank] + sum(grads[p] for p in graph.in_neighbors(rank)))
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], states[rank], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=0.01),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    ],
)
def test_checkpoint_at_step_k_gives_the_same_next_step(make_optimizer) -> None:
    def wrapped():
        model = make_model()
        opt = fast.DistributedOptimizer(
            make_optimizer(model.parameters()), model, "allreduce", engine=LocalCluster(1).engine(0)
        )
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    model, opt, scheduler = wrapped()
    for step in range(5):
        one_step(model, opt, 0, step)
        scheduler.step()
    # deep copies: state_dict() hands out the live momentum tensors, which the next step would change
    saved = copy.deepcopy((model.state_dict(), opt.state_dict(), scheduler.state_dict()))
    assert saved[1]["fast"]["step"] == 5
    one_step(model, opt, 0, 5)
    expected = [p.detach().clone() for p in model.parameters()]

    model2, opt2, scheduler2 = wrapped()
    model2.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    scheduler2.load_state_dict(saved[2])
    assert opt2.fast_worker.step == 5
    assert scheduler2.last_epoch == 5 and opt2.param_groups[0]["lr"] == saved[1]["param_groups"][0]["lr"]
    one_step(model2, opt2, 0, 5)
    for a, b in zip(model2.parameters(), expected, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)


def test_bad_models_get_clear_errors() -> None:
    engine = LocalCluster(1).engine(0)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires grad"):
        fast.DistributedOptimizer(torch.optim.SGD(frozen.parameters(), lr=0.1), frozen, engine=engine)
    meta = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError, match="on the meta device: materialise the model"):
        fast.DistributedOptimizer(torch.optim.SGD(meta.parameters(), lr=0.1), meta, engine=engine)
    mixed = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="precision='float16': FAST mixes in 'float32' or 'float64'"):
        fast.DistributedOptimizer(
            torch.optim.SGD(mixed.parameters(), lr=0.1), mixed, engine=engine, precision="float16"
        )
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not the same ones"):
        fast.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.1), a, engine=engine)
    with pytest.raises(RuntimeError, match="not wrapped"):
        fast.worker_of(torch.nn.Linear(2, 2))


def test_frozen_parameters_stay_out_and_untouched() -> None:
    model = make_model()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = fast.DistributedOptimizer(
        torch.optim.SGD(trainable, lr=LR), model, "dpsgd:ring", engine=LocalCluster(1).engine(0)
    )
    assert "0.weight" not in opt.fast_worker.model.layout.names
    for step in range(3):
        one_step(model, opt, 0, step)
    torch.testing.assert_close(model[0].weight.detach(), frozen)


def _uneven(engine, strategy: str) -> tuple[np.ndarray, int]:
    model = make_model()
    opt = fast.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), model, strategy, engine=engine
    )
    with fast.join(opt):
        for step in range(3 + engine.rank):  # uneven shards: rank r has 3 + r batches
            one_step(model, opt, engine.rank, step)
    opt.fast_worker.close()
    return opt.fast_worker.model.params().copy(), opt.fast_worker.step


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd:ring", "async:ring"])
def test_join_lets_ranks_with_uneven_batches_finish(strategy: str) -> None:
    results = LocalCluster(4, timeout=20).run(_uneven, strategy)
    steps = [s for _, s in results]
    if strategy == "async:ring":
        assert steps == [3, 4, 5, 6]  # nothing to join
    else:
        assert steps == [6, 6, 6, 6]  # the early ranks took part until the last one ran out
    if strategy == "allreduce":
        for params, _ in results[1:]:
            np.testing.assert_array_equal(params, results[0][0])


def test_shard_gives_each_rank_its_own_part() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10.0))

    def mine(engine):
        loader = fast.shard(data, batch_size=2, shuffle=False, engine=engine)
        return sorted(int(v) for (batch,) in loader for v in batch)

    parts = LocalCluster(3).run(mine)
    assert set().union(*parts) == set(range(10))  # every sample is somebody's
    assert [len(p) for p in parts] == [4, 4, 4]  # padded to equal shares, as DistributedSampler does


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd:ring"])
def test_a_model_converted_after_wrapping_is_refused_clearly(strategy: str) -> None:
    model = make_model().float()
    opt = fast.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), model, strategy, engine=LocalCluster(1).engine(0)
    )
    model.double()  # replaces the parameters' storage behind FAST's back
    with pytest.raises(RuntimeError, match=r"no longer lives in fast_torch's buffer.*wrap the model again"):
        x, y = batch(0, 0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
