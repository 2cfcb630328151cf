"""The GPU check of issue 25, ready for the first GPU machine: one command, under 5 minutes on one GPU, one table.

    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --out docs/gpu.md     # on a machine with one CUDA GPU
    OMP_NUM_THREADS=1 python benchmarks/gpu_check.py --dry-run             # the same script on the CPU (CI runs it)

It launches the language-model example's ``small`` size (fast_examples.torch_lm's model and corpus, 10.8M
parameters) on cuda with 1, 2 and 4 ranks sharing the GPU, under all-reduce, D-PSGD, async and DiLoCo (one rank:
all-reduce only, the plain one-GPU step: a neighbour strategy on one rank has nobody to mix with), plus one run in
bfloat16 (autocast with float32 master weights and ``compress=bf16`` messages). Each launch is its own ``mpiexec``
job (``--child`` mode of this file) that trains ``--steps`` steps and prints one JSON line; the parent prints the
table. Per run:

- step ms: the median step of the slowest rank after 3 warm-up steps (forward, backward, the optimizer and the
  strategy's hooks);
- staging ms/step: time inside fast_torch's device<->host copies (``Groups.to_host``/``to_device``, the only places
  the flat buffers move), each timed to a ``torch.cuda.synchronize()`` so an asynchronous copy is counted whole,
  over the steps; and the bytes they moved per step;
- copy ms: a plain device->host then host->device copy of those same bytes (pinned host memory, synchronised),
  median of 5, measured in the same process after training; staging / copy is the issue's goal (at most 1.2x);
- peak MiB/rank: ``torch.cuda.max_memory_allocated`` of each rank (the largest shown; on the CPU, peak resident
  memory);
- val. loss: the consensus model's validation loss at the end (a sanity check, not a result: runs are short).

``--dry-run`` runs the same table on the CPU with the ``tiny`` size, 1 and 2 ranks and a few steps (the CPU
staging is zero-copy in float32, so its staging column shows only the bfloat16 run's copies).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
RESULT = "RESULT "
STRATEGIES = ("allreduce", "dpsgd:ring", "async:ring", "diloco:period=10")
BF16 = "allreduce:compress=bf16"
BF16_MARK = "bf16+"
"""A run named ``bf16+<strategy>`` trains in bfloat16 autocast (float32 master weights)."""
WARMUP = 3


def plan(dry_run: bool) -> list[tuple[int, list[str]]]:
    """(ranks, runs) of every launch, in order: a run is a strategy, with a BF16_MARK prefix for bfloat16."""
    launches = [(1, ["allreduce"]), (2, [*STRATEGIES, BF16_MARK + BF16])]
    return launches if dry_run else [*launches, (4, list(STRATEGIES))]


# the child: one mpiexec job, every run of its rank count in turn ---------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import torch

    import fast_torch as fast

    torch.set_num_threads(1)
    engine = fast.init()
    for run in args.runs.split(";"):
        bf16 = run.startswith(BF16_MARK)
        strategy = run.removeprefix(BF16_MARK)
        row = measure(engine, args, strategy, bf16)
        if engine.rank == 0:
            print(RESULT + json.dumps(row), flush=True)


def measure(engine, args: argparse.Namespace, strategy: str, bf16: bool) -> dict:
    """Train ``args.steps`` steps of the LM under ``strategy`` on every rank of ``engine``; rank 0's row."""
    import numpy as np
    import torch

    import fast_torch as fast
    from fast_core import Budget
    from fast_examples.lm_data import LR, SIZES, load_corpus, shard_tokens, validation_windows, windows
    from fast_examples.torch_gpt import build_model, lm_loss
    from fast_examples.torch_lm import evaluate

    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    size = SIZES[args.size]
    text = load_corpus(None, 4_000_000)
    own, held_out = shard_tokens(text.train, engine.rank, engine.size), validation_windows(text, size.seq, 16)
    rng = np.random.default_rng([0, engine.rank])
    model = build_model(size).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR[args.size])
    budget = Budget(samples=args.steps * size.batch * engine.size)
    opt = fast.DistributedOptimizer(optimizer, model, strategy=strategy, budget=budget)
    worker = opt.fast_worker
    staged = {"seconds": 0.0, "bytes": 0}
    groups = worker.model.groups

    def timed(copy):
        def run(source, target):
            sync()
            began = time.perf_counter()
            copy(source, target)
            sync()
            staged["seconds"] += time.perf_counter() - began
            host = target if isinstance(target, torch.Tensor) else source
            staged["bytes"] += host.numel() * host.element_size()

        return run

    groups.to_host, groups.to_device = timed(groups.to_host), timed(groups.to_device)
    worker.start()
    autocast = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16, enabled=bf16)
    steps, counted = [], {"seconds": 0.0, "bytes": 0}
    while (n := worker.claim_batch(size.batch)) > 0:
        x, y = (torch.from_numpy(a[:n]).to(args.device) for a in windows(own, size.seq, size.batch, rng))
        if len(steps) == WARMUP:
            counted = dict(staged)
        sync()
        began = time.perf_counter()
        opt.zero_grad()
        with autocast:
            loss = lm_loss(model, x, y)
        loss.backward()
        opt.step()
        sync()
        steps.append(time.perf_counter() - began)
    measured = max(1, len(steps) - WARMUP)
    staging = (staged["seconds"] - counted["seconds"]) / measured
    moved = (staged["bytes"] - counted["bytes"]) // measured
    fast.average_model(model)
    val_loss = evaluate(model, held_out, size.batch)[0]
    copy = plain_copy_seconds(moved, args.device, torch) if moved else 0.0
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mine = np.array([statistics.median(steps[WARMUP:] or steps), staging, copy, peak], dtype=np.float64)
    every = np.zeros((engine.size, 4))
    every[engine.rank] = mine
    engine.allreduce(every)
    return {
        "ranks": engine.size,
        "strategy": strategy,
        "bf16": bf16,
        "step_ms": every[:, 0].max() * 1e3,
        "staging_ms": every[:, 1].mean() * 1e3,
        "staged_mb": moved / 1e6,
        "copy_ms": every[:, 2].mean() * 1e3,
        "peak_mib": every[:, 3].max() / 2**20,
        "val_loss": val_loss,
    }


def plain_copy_seconds(nbytes: int, device: str, torch) -> float:
    """Median of 5: ``nbytes`` device->host into pinned memory, then host->device, synchronised (on the CPU: two
    host copies, the same bytes each way)."""
    values = nbytes // 4
    source = torch.ones(values, device=device)
    cuda = device.startswith("cuda")
    host = torch.empty(values, pin_memory=cuda)
    back = torch.empty(values, device=device)
    times = []
    for _ in range(5):
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        host.copy_(source, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        back.copy_(host, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


# the parent: every launch, then the table ------------------------------------------------------------------------
def launch(ranks: int, runs: list[str], args: argparse.Namespace) -> list[dict]:
    beside = Path(sys.executable).parent / "mpiexec"
    command = [
        str(beside) if beside.exists() else "mpiexec",
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "mpi4py",
        str(HERE),
        "--child",
    ]
    command += ["--runs", ";".join(runs), "--device", args.device, "--size", args.size, "--steps", str(args.steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or len(lines) != len(runs):
        sys.exit(f"gpu_check: the launch on {ranks} rank(s) failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return [json.loads(line.removeprefix(RESULT)) for line in lines]


def table(rows: list[dict]) -> str:
    lines = [
        "| ranks | strategy | precision | step ms (slowest rank) | staging ms/step | MB staged/step | plain copy ms "
        "| staging / copy | peak MiB/rank | val. loss |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r['staging_ms'] / r['copy_ms']:.2f}" if r["copy_ms"] > 0 else "- (nothing staged)"
        lines.append(
            f"| {r['ranks']} | `{r['strategy']}` | {'bf16 autocast' if r['bf16'] else 'float32'} | {r['step_ms']:.1f} "
            f"| {r['staging_ms']:.2f} | {r['staged_mb']:.1f} | {r['copy_ms']:.2f} | {ratio} | {r['peak_mib']:.0f} "
            f"| {r['val_loss']:.3f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, tiny size, 1 and 2 ranks")
    parser.add_argument("--steps", type=int, help="steps per launch (default 30; dry run 6)")
    parser.add_argument("--out", type=Path, help="write the table and the device's name into this markdown file")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one launch may take")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runs", default="allreduce", help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    args.size = args.size or ("tiny" if args.dry_run else "small")
    args.steps = args.steps or (6 if args.dry_run else 30)
    return args


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("gpu_check: no CUDA device here; --dry-run runs the same check on the CPU")
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores), dry run"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    name = device_name(args.device)
    began = time.monotonic()
    rows = []
    for ranks, runs in plan(args.dry_run):
        rows += launch(ranks, runs, args)
        done = ", ".join(f"{r['strategy']} {r['step_ms']:.1f}" for r in rows[-len(runs) :])
        print(f"{ranks} rank(s): {done} ms/step", flush=True)
    text = (
        f"`{' '.join(['python', 'benchmarks/gpu_check.py', *(argv if argv is not None else sys.argv[1:])])}` on "
        f"{name}, {datetime.date.today()}, LM size {args.size}, {args.steps} steps per launch, "
        f"{time.monotonic() - began:.0f} s in all.\n\n{table(rows)}\n"
    )
    print(text)
    if args.out:
        args.out.write_text(f"# GPU check\n\n{text}", encoding="utf-8")


if __name__ == "__main__":
    main()
