"""fast_torch.horovod: a script written for Horovod runs with one changed import and trains by Horovod's rule.

Horovod itself is not installed here (it builds against a given torch, and its last release predates this one),
so its rule is computed in one process: identical replicas, each step's gradient the mean (or sum) over ranks of
the ranks' own batch gradients, clipped, then the optimizer's step.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from docblocks import documented_commands
from fast_cli import fast
from mpirun import run_mpi
from sklearn.datasets import load_digits
from torch.utils.data.distributed import DistributedSampler

import fast_torch.horovod as hvd

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"


def _load_script():
    spec = importlib.util.spec_from_file_location("horovod_script", HERE / "horovod_script.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _horovod_rule(ranks: int, op: str) -> tuple[dict[str, np.ndarray], list[float]]:
    """The script's training as Horovod computes it, in one process."""
    script = _load_script()
    torch.manual_seed(1234)  # rank 0's start, which broadcast_parameters gives every rank
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    digits = load_digits()
    x_all = torch.tensor(digits.data[:400] / 16.0, dtype=torch.float32)
    y_all = torch.tensor(digits.target[:400])
    samplers = [DistributedSampler(range(400), num_replicas=ranks, rank=r, shuffle=True, seed=7) for r in range(ranks)]
    batches = [[list(s)[i : i + script.BATCH] for i in range(0, len(s), script.BATCH)] for s in samplers]
    optimizer = torch.optim.SGD(model.parameters(), lr=script.LR, momentum=script.MOMENTUM, weight_decay=script.DECAY)
    losses = []
    for step in range(script.STEPS):
        grads, step_losses = [], []
        for r in range(ranks):
            model.zero_grad()
            index = batches[r][step]
            loss = torch.nn.functional.cross_entropy(model(x_all[index]), y_all[index])
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            step_losses.append(loss.item())
        for i, p in enumerate(model.parameters()):
            total = sum(g[i] for g in grads)
            p.grad = total / ranks if op == "average" else total
        torch.nn.utils.clip_grad_norm_(model.parameters(), script.CLIP)
        optimizer.step()
        losses.append(float(np.mean(step_losses)))
    return {name: p.detach().numpy() for name, p in model.named_parameters()}, losses


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["average", "sum"])
def test_a_horovod_script_trains_by_horovods_rule(tmp_path: Path, op: str) -> None:
    out = tmp_path / "result.npz"
    run_mpi(2, HERE / "horovod_script.py", str(out), op, timeout=120)
    result = np.load(out)
    expected, losses = _horovod_rule(2, op)
    for name, value in expected.items():
        np.testing.assert_allclose(result[name], value, rtol=2e-5, atol=2e-6, err_msg=name)
    np.testing.assert_allclose(result["losses"], losses, rtol=1e-5)
    assert losses[-1] < losses[0]  # it trained


@pytest.mark.mpi
def test_horovods_collectives_on_three_ranks_match_numpy() -> None:
    output = run_mpi(3, HERE / "horovod_cases.py", timeout=120)
    assert output.count("horovod cases passed") == 3, output


@pytest.mark.mpi
@pytest.mark.parametrize("command", documented_commands("docs/guides/horovod.md", "horovod_torch_mnist"), ids=" ".join)
def test_the_documented_horovod_example_learns(command: list[str]) -> None:
    """docs/guides/horovod.md's two commands (all-reduce, then a FAST strategy) in their 2-rank test forms."""
    epochs = int(command[command.index("--epochs") + 1])
    done = fast(*command[1:], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    accuracies = [float(a) for a in re.findall(r"Accuracy: ([0-9.]+)%", done.stdout)]
    assert len(accuracies) == epochs and accuracies[-1] > (60.0 if epochs > 1 else 30.0), done.stdout


@pytest.mark.mpi
def test_horovods_synthetic_benchmark_runs_with_its_import_changed() -> None:
    """ResNet-18 (11.7M parameters) on 32x32 images, its gradients all-reduced in fp16 messages: 2 ranks."""
    sizes = "--model resnet18 --batch-size 4 --image-size 32 --num-warmup-batches 1 --num-batches-per-iter 2"
    module = "fast_examples.horovod_torch_synthetic_benchmark"
    done = fast("run", "-n", "2", "-m", module, *sizes.split(), "--num-iters", "3", "--fp16-allreduce", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    iterations = re.findall(r"Iter #(\d+): ([0-9.]+) img/sec per CPU", done.stdout)
    assert [int(i) for i, _ in iterations] == [0, 1, 2] and all(float(r) > 0 for _, r in iterations)
    job = float(re.search(r"Job img/sec on 2 CPU\(s\): ([0-9.]+)", done.stdout).group(1))
    per_rank = float(re.search(r"Img/sec per CPU: ([0-9.]+)", done.stdout).group(1))
    assert 0 < job <= 2.2 * per_rank, done.stdout  # the job's rate: never more than the ranks' rates summed


def test_what_fast_cannot_honour_is_refused_with_a_reason() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Adasum is not supported by FAST"):
        hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Adasum)
    with pytest.raises(ValueError, match="process sets are not supported"):
        hvd.allreduce(torch.ones(1), process_set=object())
    with pytest.raises(ValueError, match="only valid with op=hvd.Average"):
        hvd.DistributedOptimizer(optimizer, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="init\\(comm=..., process_sets=...\\) is not supported"):
        hvd.init(comm=object())
    with pytest.raises(AttributeError, match="no ElasticSampler: shard the data by hvd.rank"):
        hvd.elastic.ElasticSampler  # noqa: B018 - the attribute access is the test
    with pytest.raises(AttributeError, match="Horovod's callbacks are Keras'"):
        hvd.callbacks  # noqa: B018
    with pytest.raises(AttributeError, match="fast run --profile"):
        hvd.start_timeline  # noqa: B018
    with pytest.raises(TypeError, match="sends JSON, never a pickle"):
        hvd.broadcast_object({"model": model})
    with pytest.raises(TypeError, match="takes a torch.Tensor"):
        hvd.allreduce(3.0)
    with pytest.raises(ValueError, match="not one of hvd.Compression.none or hvd.Compression.fp16, or one of FAST's"):
        hvd.allreduce(torch.ones(1), compression="zstd")
    with pytest.raises(ValueError, match="give op= or the older average="):
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)


def test_named_parameters_must_name_the_optimizers_parameters_once() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="not in it"):
        hvd.DistributedOptimizer(optimizer, named_parameters=named[:2])
    with pytest.raises(ValueError, match="more than once"):
        hvd.DistributedOptimizer(optimizer, named_parameters=[("w", p) for _, p in named])


def test_sum_is_refused_under_a_strategy_that_mixes_parameters() -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="only all-reduce does"):
        hvd.DistributedOptimizer(optimizer, op=hvd.Sum, strategy="dpsgd:ring")


def test_the_optimizer_is_the_users_own_with_horovods_methods() -> None:
    model = torch.nn.Linear(3, 1)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = hvd.DistributedOptimizer(plain, named_parameters=model.named_parameters(), backward_passes_per_step=2)
    assert optimizer is plain and optimizer.fast_worker.strategy.name == "allreduce"  # the same object, hooked
    before = model.weight.detach().clone()
    for _ in range(2):  # two backward passes, one step: the gradients accumulate, as Horovod's option says
        model(torch.ones(1, 3)).sum().backward()
    optimizer.synchronize()
    grad = model.weight.grad.clone()
    with optimizer.skip_synchronize():
        optimizer.step()
    np.testing.assert_allclose(grad.numpy(), np.full((1, 3), 2.0))
    np.testing.assert_allclose(model.weight.detach().numpy(), (before - 0.1 * grad).numpy(), rtol=1e-6)


def test_fp16_compression_sends_the_gradients_through_the_fp16_ring() -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), compression=hvd.Compression.fp16)
    assert repr(optimizer.fast_worker.strategy) == "AllReduce(compress='fp16')"  # fast_core.compression.ring
    other = torch.nn.Linear(3, 1)
    kept = hvd.DistributedOptimizer(
        torch.optim.SGD(other.parameters(), lr=0.1), compression=hvd.Compression.fp16, strategy="dpsgd:ring"
    )
    assert kept.fast_worker.strategy.name == "dpsgd" and kept.fast_worker.strategy.compress == "none"
    for name in ("bf16", "int8"):  # FAST's own codecs, by name
        sgd = torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.1)
        by_name = hvd.DistributedOptimizer(sgd, compression=name)
        assert repr(by_name.fast_worker.strategy) == f"AllReduce(compress={name!r})"
