"""FAST with PyTorch: a small CNN on MNIST-1D (made locally) or scikit-learn's real 8x8 digits, on 4 MPI ranks.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py examples/torch_mnist1d.py --strategy dpsgd:ring [--data digits]

Each rank trains on its own shard (``fast.shard``); ``fast.DistributedOptimizer`` runs the strategy around the
optimizer's own step. At each epoch end every rank scores its replica on the same held-out validation set (FAST
restarts all ranks from the best replica then; a no-op for the other strategies) and rank 0 reports the mean loss
of all ranks and their consensus distance (both collectives, so asynchronous strategies report rank 0's own loss
instead, not to wait for the slowest rank); at the end, the test accuracy of the averaged model. Under ``fast run``
the worker also records loss and samples per step and each replica's validation accuracy per epoch; ``--ddp`` trains
with torch's DistributedDataParallel instead, the baseline of ``fast bench --compare-ddp``.

The pieces are importable (``load_data``, ``build_model``, ``accuracy``, ``train``) so tests reuse them.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import fast_torch as fast
from fast_core import Strategy
from fast_core.datasets import TASKS, Task, example_task
from fast_core.reporting import epoch_summary
from fast_core.strategies.spec import strategy_from_environment

Split = tuple[torch.Tensor, torch.Tensor]


def load_data(name: str = "mnist1d", seed: int = 0) -> tuple[Task, Split, Split, Split]:
    """The task and its (train, validation, test) splits as tensors with a channel axis, the same on every rank."""
    task = example_task(name, seed)

    def tensors(split: tuple[np.ndarray, np.ndarray]) -> Split:
        images, labels = split
        return torch.from_numpy(images.reshape(-1, 1, *task.sample_shape)), torch.from_numpy(labels)

    return task, tensors(task.train), tensors(task.validation), tensors(task.test)


def build_model(task: Task, seed: int = 0) -> torch.nn.Module:
    """A small CNN: 1-D for MNIST-1D (about 9k float32 parameters), 2-D for the 8x8 digits (about 10k)."""
    torch.manual_seed(seed)
    if len(task.sample_shape) == 1:
        length = task.sample_shape[0]
        return torch.nn.Sequential(
            torch.nn.Conv1d(1, 32, 5, padding=2),
            torch.nn.ReLU(),
            torch.nn.Conv1d(32, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool1d(2),
            torch.nn.Conv1d(32, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool1d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * (length // 4), task.classes),
        )
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, task.classes),
    )


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: Split) -> float:
    images, labels = data
    model.eval()
    correct = (model(images).argmax(dim=1) == labels).sum().item()
    model.train()
    return correct / len(labels)


def train(
    strategy: str | Strategy = "dpsgd:ring",
    data: str = "mnist1d",
    epochs: int = 10,
    batch_size: int = 16,
    lr: float = 0.05,
    seed: int = 0,
    verbose: bool = True,
    ddp: bool = False,
) -> float:
    """Train one model with ``strategy`` on every rank (collective); returns the averaged model's test accuracy.

    ``ddp``: DistributedDataParallel averages the gradients instead, FAST's worker only counts steps and reports."""
    engine = fast.init()
    task, train_set, val_set, test_set = load_data(data, seed)
    loader = fast.shard(TensorDataset(*train_set), batch_size=batch_size, drop_last=True, seed=seed)
    model = build_model(task, seed)
    if ddp:  # gloo on the MPI job's ranks; MASTER_ADDR and MASTER_PORT come from the environment (fast run sets them)
        dist.init_process_group("gloo", rank=engine.rank, world_size=engine.size)
        strategy = Strategy()  # the base Strategy exchanges nothing
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), model, strategy=strategy)
    worker = opt.fast_worker
    step_model = DistributedDataParallel(model) if ddp else model  # DDP averages gradients during backward
    if verbose and engine.rank == 0:
        print(
            f"{engine.size} workers, strategy {'DDP (gloo)' if ddp else worker.strategy}, {task.name}: "
            f"{len(loader) * batch_size} training samples each, {len(val_set[1])} for validation, "
            f"{len(test_set[1])} for testing"
        )
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for images, labels in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(step_model(images), labels)
            loss.backward()
            opt.step()
            total += loss.item()
            batches += 1
            worker.record(loss=loss.item(), samples=len(labels))  # fast run's log and progress bar
        mean_loss, spread = epoch_summary(worker, total / max(batches, 1))  # before FAST's restart makes spread 0
        val_accuracy = accuracy(model, val_set)
        worker.record_epoch(loss=mean_loss, val_accuracy=val_accuracy)
        worker.end_epoch(val_accuracy)  # FAST: every rank restarts from the best replica
        if verbose and engine.rank == 0:
            spread_text = "n/a" if spread is None else f"{spread:.2e}"
            print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}  consensus distance {spread_text}")
    fast.average_model(model)  # closes the worker first: no message is left in flight
    test_accuracy = accuracy(model, test_set)
    worker.record_result(test_accuracy=test_accuracy)
    if ddp:
        dist.destroy_process_group()
    if verbose and engine.rank == 0:
        metrics = worker.metrics.as_dict()
        print(
            f"test accuracy of the averaged model: {test_accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
        )
    return test_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--strategy", help="e.g. allreduce, dpsgd:ring, async:torus, fast:torus (default: fast run's, else dpsgd:ring)"
    )
    parser.add_argument("--data", choices=TASKS, default="mnist1d", help="the task (both made locally, no download)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--ddp", action="store_true", help="train with DistributedDataParallel (gloo) instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(
        args.strategy or strategy_from_environment(default="dpsgd:ring"),
        args.data,
        args.epochs,
        args.batch_size,
        args.lr,
        ddp=args.ddp,
    )


if __name__ == "__main__":
    main()
