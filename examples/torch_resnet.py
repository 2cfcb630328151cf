"""FAST with PyTorch at ImageNet layout: ResNet-18 or ResNet-50 on synthetic images, for step time and memory.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py examples/torch_resnet.py --arch resnet50 --strategy dpsgd:ring
    fast run -n 2 --strategy allreduce -m fast_examples.torch_resnet --arch resnet18 --image-size 64 --steps 5

Each rank trains its replica (``fast_examples.resnet_model``: built here, torchvision's wheel does not import against
every CPU torch) on random 3 x S x S images with random labels from its own generator, SGD with momentum through
``fast.DistributedOptimizer``; it is not meant to reach an accuracy. It prints the median step time (the slowest
rank's, after ``--warmup`` steps), the peak resident memory of each rank and the model's bytes, and the consensus
model's loss on a fixed batch. ``--steps`` is the job's budget (steps per rank; a lockstep strategy runs exactly
that many on every rank).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import time

import numpy as np
import torch

import fast_torch as fast
from fast_core import Budget, Strategy, run_config
from fast_core.strategies.spec import strategy_from_environment
from fast_examples.resnet_model import LAYOUTS, build_resnet, synthetic_batch


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def gathered(engine, value: float) -> list[float]:
    """Every rank's ``value``, in rank order, on every rank (collective)."""
    values = np.zeros(engine.size)
    values[engine.rank] = value
    engine.allreduce(values)
    return values.tolist()


def train(
    strategy: str | Strategy = "dpsgd:ring",
    arch: str = "resnet50",
    steps: int = 10,
    warmup: int = 2,
    batch_size: int = 4,
    image_size: int = 224,
    classes: int = 1000,
    lr: float = 0.05,
    bf16: bool = False,
    seed: int = 0,
    verbose: bool = True,
) -> dict[str, float]:
    """Train ``steps`` steps per rank (collective); returns the step time, memory and loss figures of rank 0."""
    engine = fast.init()
    model = build_resnet(arch, classes, seed)
    config = run_config()
    budget = None if Budget.from_config(config) is not None else Budget(samples=steps * batch_size * engine.size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = fast.DistributedOptimizer(optimizer, model, strategy=strategy, budget=budget)
    worker = opt.fast_worker
    worker.start()
    generator = torch.Generator().manual_seed(seed * 1000 + engine.rank)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    times = []
    while (n := worker.claim_batch(batch_size)) > 0:
        images, labels = synthetic_batch(n, image_size, classes, generator)
        began = time.perf_counter()
        opt.zero_grad()
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - began)
        worker.records.step(loss=loss.item(), samples=n)
    fast.average_model(model)
    probe = synthetic_batch(batch_size, image_size, classes, torch.Generator().manual_seed(seed + 99))
    model.eval()
    with torch.no_grad():
        consensus_loss = torch.nn.functional.cross_entropy(model(probe[0]), probe[1]).item()
    steps_each = gathered(engine, statistics.median(times[warmup:] or times))
    slowest, peaks = max(steps_each), gathered(engine, peak_rss_bytes())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    worker.records.result(step_seconds=slowest, consensus_loss=consensus_loss)
    if verbose and engine.rank == 0:
        print(
            f"{arch}, {image_size}x{image_size}, batch {batch_size}, {engine.size} ranks, strategy {worker.strategy}"
            f"{', bf16 autocast' if bf16 else ''}: median step {slowest * 1e3:.0f} ms (slowest rank, after "
            f"{warmup} warm-up steps); model {model_bytes / 2**20:.0f} MiB; peak resident memory per rank "
            f"{', '.join(f'{p / 2**20:.0f}' for p in peaks)} MiB; consensus model's loss on a fixed batch "
            f"{consensus_loss:.3f}"
        )
    return {"step_seconds": slowest, "peak_rss": max(peaks), "model_bytes": model_bytes, "loss": consensus_loss}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", help="e.g. allreduce, dpsgd:ring (default: fast run's, else dpsgd:ring)")
    parser.add_argument("--arch", choices=sorted(LAYOUTS), default="resnet50")
    parser.add_argument("--steps", type=int, default=10, help="steps per rank (the job's budget)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the median step time")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast, float32 master weights")
    args = parser.parse_args(argv)
    if args.image_size < 32 or args.batch_size < 1 or args.steps < 1:
        sys.exit("torch_resnet: --image-size must be at least 32, --batch-size and --steps at least 1")
    torch.set_num_threads(1)
    train(
        args.strategy or strategy_from_environment(default="dpsgd:ring"),
        args.arch,
        args.steps,
        args.warmup,
        args.batch_size,
        args.image_size,
        args.classes,
        args.lr,
        args.bf16,
    )


if __name__ == "__main__":
    main()
