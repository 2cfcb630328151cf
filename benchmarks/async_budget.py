"""Asynchronous strategies under a shared work budget with one straggler: the consensus model over time.

Issue 12's question: does an asynchronous strategy, stopped by a shared sample budget (so a faster rank simply does
more of the work and every rank stops together), reach all-reduce's accuracy sooner? Every rank trains softmax
regression on random ReLU features of its shard of scikit-learn's digits; each step sleeps ``--compute-ms`` to stand
in for a real model's compute, and the straggler rank sleeps ``--straggler`` times as long (the same seconds per step
under every strategy: a sleep, not a measured stretch). Every rank keeps a copy of its parameters every
``--every-ms`` from the common start; after the run rank 0 averages the ranks' copies at each point (the consensus
model) and evaluates it, so accuracy-over-time is the consensus model's, not one replica's. Rounds interleave the
strategies; medians over ``--repeats`` rounds.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py benchmarks/async_budget.py --out docs/benchmarks.md

``--strategy`` may be repeated (a strategy string contains commas, so the flag is the separator).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import numpy as np
from job_figures import Job, RankSpan, gather_job
from mpi4py import MPI
from report import command_line, markers, write_section
from strategies import Task, batch_stream, load_task

import fast_core
from fast_core.model.numpy_model import SGD, SoftmaxRegression

START, END = markers("async-budget")
DEFAULT = ["allreduce", "async:ring", "async:ring,staleness=4", "adpsgd:ring", "gossip:synchronous=false"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", dest="strategies", action="append", metavar="SPEC", help="default: a set")
    parser.add_argument("--epochs", type=float, default=4.0, help="global epochs: the budget is this x the train set")
    parser.add_argument("--compute-ms", type=float, default=5.0, help="emulated compute per step (a sleep)")
    parser.add_argument("--straggler", type=float, default=3.0, help="the last rank computes this x longer")
    parser.add_argument("--features", type=int, default=1024, help="random ReLU features")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--every-ms", type=float, default=100.0, help="consensus snapshot period")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.strategies = args.strategies or DEFAULT
    return args


def run_once(comm: MPI.Comm, spec: str, task: Task, args: argparse.Namespace, total_train: int) -> Job | None:
    rank, size = comm.Get_rank(), comm.Get_size()
    engine = fast_core.mpi_engine(comm, timeout=fast_core.run_config().timeout)
    model = SoftmaxRegression(task.x_train.shape[1], 10, optimizer=SGD(args.lr), seed=0)
    budget = fast_core.Budget(samples=int(args.epochs * total_train))
    worker = fast_core.Worker(model, spec, engine, budget=budget, observers=[]).start()
    sleep = args.compute_ms / 1e3 * (args.straggler if rank == size - 1 else 1.0)
    stream = batch_stream(task, args.batch_size, seed=rank)
    span = RankSpan(params=model.params, every_s=args.every_ms / 1e3)
    comm.Barrier()
    span.start()
    steps = 0
    while (n := worker.claim_batch(args.batch_size)) > 0:
        x, y = next(stream)
        model.compute_gradients(x[:n], y[:n])
        time.sleep(sleep)
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
        span.step_end()
        steps += 1
    worker.close()
    final = worker.group.average_params()
    return gather_job(
        comm, span, worker.metrics.samples, steps, final, lambda p: model.accuracy(task.x_test, task.y_test, p)
    )


def report(args: argparse.Namespace, results: dict[str, list[Job]], size: int) -> str:
    base = results.get("allreduce")
    target = statistics.median(r.final_accuracy for r in base) - 0.005 if base else None
    base_wall = statistics.median(r.wall for r in base) if base else None
    lines = [
        START,
        "## Asynchronous strategies under a shared work budget, one straggler",
        "",
        f"`{command_line(size)}`",
        "",
        f"{size} ranks on this machine, {datetime.date.today()}. Softmax regression on {args.features} random ReLU "
        f"features of digits, batch {args.batch_size}, SGD lr {args.lr}; every strategy gets the same budget of "
        f"{args.epochs:g} global epochs (samples summed over the ranks); each step sleeps {args.compute_ms:g} ms, "
        f"the last rank {args.straggler:g}x as long. Job wall-clock: common start to the last rank's stop. "
        "Accuracy: test accuracy of the consensus model (the mean of the ranks' parameters), snapshots every "
        f"{args.every_ms:g} ms. Target: all-reduce's final accuracy minus 0.5 point"
        + (f" ({target:.4f})" if target is not None else "")
        + f". Medians over {args.repeats} interleaved rounds; steps per rank from the first round.",
        "",
        "| strategy | job wall-clock s | vs all-reduce | samples/s (job) | s to target | x all-reduce's wall | "
        "final accuracy | consensus distance at end | steps per rank |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for spec, runs in results.items():
        wall = statistics.median(r.wall for r in runs)
        reached = [r.time_to(target) for r in runs] if target is not None else []
        reached_ok = [t for t in reached if t is not None]
        to_target = statistics.median(reached_ok) if len(reached_ok) == len(runs) and runs else None
        ratio = f"{wall / base_wall:.2f}" if base_wall else "–"
        target_text = f"{to_target:.2f}" if to_target is not None else f"not reached ({len(reached_ok)}/{len(runs)})"
        frac = f"{to_target / base_wall:.2f}" if to_target is not None and base_wall else "–"
        lines.append(
            f"| `{spec}` | {wall:.2f} | {ratio} | {statistics.median(r.samples / r.wall for r in runs):.0f} | "
            f"{target_text} | {frac} | {statistics.median(r.final_accuracy for r in runs):.4f} | "
            f"{statistics.median(float(r.distance[-1]) if r.distance.size else np.nan for r in runs):.2e} | "
            f"{runs[0].steps} |"
        )
    lines += ["", END]
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    task = load_task(rank, size, args.features)
    total_train = int(comm.allreduce(len(task.y_train)))
    results: dict[str, list[Job]] = {spec: [] for spec in args.strategies}
    for round_ in range(args.repeats):
        for spec in args.strategies:
            result = run_once(comm, spec, task, args, total_train)
            if rank == 0:
                results[spec].append(result)
                print(
                    f"round {round_ + 1} {spec}: wall {result.wall:.2f} s, final {result.final_accuracy:.4f}, "
                    f"steps {result.steps}",
                    flush=True,
                )
    if rank == 0:
        text = report(args, results, size)
        print(text)
        if args.out:
            write_section(args.out, "async-budget", text)


if __name__ == "__main__":
    main()
