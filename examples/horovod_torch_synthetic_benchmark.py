"""Horovod's PyTorch synthetic benchmark, run by FAST with one changed import.

    fast run -n 4 -m fast_examples.horovod_torch_synthetic_benchmark --model resnet50
    fast run -n 4 --strategy dpsgd:ring -m fast_examples.horovod_torch_synthetic_benchmark --fp16-allreduce

Written as Horovod's ``pytorch_synthetic_benchmark.py`` is (its arguments, ``hvd.DistributedOptimizer`` with
``named_parameters`` and ``compression``, the parameter and optimizer-state broadcasts, warm-up batches, then
iterations of timed batches on random images) with two differences: the ResNet comes from
``fast_examples.resnet_model`` (torchvision's wheel does not import against every CPU torch), and
``--image-size`` makes it small enough for a CPU. Besides Horovod's per-rank rate it prints the job's: every rank's
images over the slowest rank's wall-clock, not the per-rank rate times the ranks.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import fast_torch.horovod as hvd  # was: import horovod.torch as hvd
from fast_examples.resnet_model import LAYOUTS, build_resnet


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce")
    parser.add_argument("--model", default="resnet50", choices=sorted(LAYOUTS), help="model to benchmark")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
    parser.add_argument("--image-size", type=int, default=224, help="height and width of the random images")
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="number of warm-up batches")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="number of batches per iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    parser.add_argument("--use-adasum", action="store_true", help="use the Adasum algorithm to do reduction")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    args = arguments(argv)
    hvd.init()
    torch.manual_seed(hvd.rank())
    model = build_resnet(args.model, seed=hvd.rank())  # each rank starts elsewhere: the broadcast below fixes it
    lr_scaler = hvd.size() if not args.use_adasum else 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Adasum if args.use_adasum else hvd.Average,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 1000, (args.batch_size,))

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(text: str) -> None:
        if hvd.rank() == 0:
            print(text, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPUs: {hvd.size()}")
    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates, began = [], timeit.default_timer()
    for x in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / seconds)
        log(f"Iter #{x}: {rates[-1]:.1f} img/sec per CPU")
    elapsed = timeit.default_timer() - began
    mean, spread = np.mean(rates), 1.96 * np.std(rates)
    log(f"Img/sec per CPU: {mean:.1f} +-{spread:.1f}")
    slowest = float(hvd.allreduce(torch.tensor(elapsed), op=hvd.Max))  # the job ends with its slowest rank
    images = args.batch_size * args.num_batches_per_iter * args.num_iters * hvd.size()
    log(f"Job img/sec on {hvd.size()} CPU(s): {images / slowest:.1f} (every rank's images over the slowest's time)")
    return images / slowest


if __name__ == "__main__":
    main()
