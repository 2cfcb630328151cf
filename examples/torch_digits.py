"""FAST with PyTorch: a small CNN on scikit-learn's real 8x8 digits, trained on 4 MPI ranks.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py examples/torch_digits.py --strategy dpsgd:ring

Each rank trains on its own shard (``fast.shard``); ``fast.DistributedOptimizer`` runs the strategy around the
optimizer's own step. At each epoch end every rank scores its replica on the same held-out validation digits
(FAST restarts all ranks from the best replica then; a no-op for the other strategies) and rank 0 reports the
mean loss of all ranks and their consensus distance; at the end, the test accuracy of the averaged model.

The pieces are importable (``load_data``, ``build_model``, ``accuracy``, ``train``) so tests reuse them.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.utils.data import TensorDataset

import fast_torch as fast
from fast_core.datasets import digits, train_test_split

Split = tuple[torch.Tensor, torch.Tensor]


def load_data(seed: int = 0, test_fraction: float = 0.2, val_fraction: float = 0.1) -> tuple[Split, Split, Split]:
    """(train, validation, test) as (images N x 1 x 8 x 8 float32, labels int64), the same on every rank."""
    x, y = digits()
    x_train, y_train, x_test, y_test = train_test_split(x, y, test_fraction=test_fraction, seed=seed)
    x_train, y_train, x_val, y_val = train_test_split(x_train, y_train, test_fraction=val_fraction, seed=seed + 1)

    def tensors(images: np.ndarray, labels: np.ndarray) -> Split:
        return torch.from_numpy(images.reshape(-1, 1, 8, 8).astype(np.float32)), torch.from_numpy(labels)

    return tensors(x_train, y_train), tensors(x_val, y_val), tensors(x_test, y_test)


def build_model(seed: int = 0) -> torch.nn.Module:
    """Two 3x3 convolutions, a 2x2 max-pool and a linear classifier (about 10k float32 parameters)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 10),
    )


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: Split) -> float:
    images, labels = data
    model.eval()
    correct = (model(images).argmax(dim=1) == labels).sum().item()
    model.train()
    return correct / len(labels)


def train(
    strategy: str = "dpsgd:ring",
    epochs: int = 10,
    batch_size: int = 16,
    lr: float = 0.05,
    seed: int = 0,
    verbose: bool = True,
) -> float:
    """Train one model with ``strategy`` on every rank (collective); returns the averaged model's test accuracy."""
    engine = fast.init()
    train_set, val_set, test_set = load_data(seed)
    loader = fast.shard(TensorDataset(*train_set), batch_size=batch_size, drop_last=True, seed=seed)
    model = build_model(seed)
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), model, strategy=strategy)
    worker = opt.fast_worker
    if verbose and engine.rank == 0:
        print(
            f"{engine.size} workers, strategy {worker.strategy}, {len(loader) * batch_size} training digits each, "
            f"{len(val_set[1])} for validation, {len(test_set[1])} for testing"
        )
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for images, labels in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            total += loss.item()
            batches += 1
        mean_loss = np.array([total / max(batches, 1)])
        worker.engine.allreduce(mean_loss)
        spread = worker.consensus_distance()  # before FAST's restart, which would make it 0
        worker.end_epoch(accuracy(model, val_set))  # FAST: every rank restarts from the best replica
        if verbose and engine.rank == 0:
            print(f"epoch {epoch + 1:3d}  loss {mean_loss[0] / engine.size:.4f}  consensus distance {spread:.2e}")
    fast.average_model(model)  # closes the worker first: no message is left in flight
    test_accuracy = accuracy(model, test_set)
    if verbose and engine.rank == 0:
        metrics = worker.metrics.as_dict()
        print(
            f"test accuracy of the averaged model: {test_accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
        )
    return test_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="dpsgd:ring", help="e.g. allreduce, dpsgd:ring, async:torus, fast:torus")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(args.strategy, args.epochs, args.batch_size, args.lr)


if __name__ == "__main__":
    main()
