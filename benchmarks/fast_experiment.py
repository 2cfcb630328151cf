"""FAST's own experiment in miniature (Viviani 2019): 16 workers on a 4x4 torus against a parameter server.

The paper trained 16 workers with FAST's asynchronous gradient exchange on a torus, restarting every epoch from the
best replica, against a parameter server with 8 servers, synchronous and asynchronous. Here the same four jobs
(plus all-reduce, the synchronous baseline without servers) run on one machine: softmax regression on random ReLU
features of scikit-learn's digits (benchmarks/strategies.py's task; a NumPy model, because 16 torch processes do
not fit 2 shared cores), each step sleeping ``--compute-ms`` to stand in for a real model's compute without
using a core. Every rank runs ``--epochs`` passes over its shard; at each pass's end it tells the worker its
replica's validation accuracy (FAST restarts from the best replica, a collective; the others do nothing) and the
ranks average their parameters to score the consensus model on the test set, so under every strategy the ranks
meet once per epoch, as FAST's restart makes them meet in the paper.

    OMP_NUM_THREADS=1 mpiexec -n 16 python -m mpi4py benchmarks/fast_experiment.py --out docs/fast_experiment.md

``--strategy`` may be repeated (a strategy string contains commas, so the flag is the separator).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI
from report import command_line, gather_to_root, markers, write_section
from strategies import Task, batch_stream, load_task

import fast_core
from fast_core.model.numpy_model import SGD, SoftmaxRegression

STRATEGIES = ["fast:torus", "ps:servers=8", "ps:servers=8,mode=async", "allreduce"]
START, END = markers("fast_experiment")


OPTIONS: dict[str, tuple[type, object, str]] = {
    "--epochs": (int, 20, "passes of every rank over its shard"),
    "--compute-ms": (float, 10.0, "emulated compute per step (a sleep)"),
    "--features": (int, 1024, "random ReLU features of the 64 pixels"),
    "--batch-size": (int, 8, "per worker: 10 steps per epoch on 16 workers"),
    "--lr": (float, 0.2, "SGD learning rate, the same for every strategy"),
    "--repeats": (int, 3, "rounds over all strategies; medians reported"),
    "--out": (Path, None, "Markdown file whose fast_experiment section is written or replaced"),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", dest="strategies", action="append", metavar="SPEC", help="default: the four")
    for flag, (kind, default, text) in OPTIONS.items():
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args(argv)
    args.strategies = args.strategies or STRATEGIES
    return args


@dataclass
class Run:
    """One strategy's job, as rank 0 reports it."""

    strategy: str
    curve: list[float]  # the consensus model's test accuracy after each epoch
    wall: float  # seconds from the common start to the last rank's end
    mb_sent: np.ndarray  # MB sent by each rank


def run(comm: MPI.Comm, spec: str, task: Task, args: argparse.Namespace) -> Run | None:
    """Train a fresh model with ``spec`` for ``args.epochs`` passes; rank 0 gets the Run."""
    rank = comm.Get_rank()
    model = SoftmaxRegression(task.x_train.shape[1], 10, optimizer=SGD(args.lr), seed=0)
    engine = fast_core.mpi_engine(comm, timeout=fast_core.run_config().timeout)
    worker = fast_core.Worker(model, spec, engine, observers=[]).start()
    stream = batch_stream(task, args.batch_size, seed=rank)
    steps = len(task.y_train) // args.batch_size
    curve = []
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(args.epochs):
        for _ in range(steps):
            x, y = next(stream)
            model.compute_gradients(x, y)
            time.sleep(args.compute_ms / 1e3)
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        worker.end_epoch(model.accuracy(task.x_val, task.y_val))  # FAST: all restart from the best replica
        curve.append(model.accuracy(task.x_test, task.y_test, worker.group.average_params()))
    worker.close()
    table = gather_to_root(comm, [time.perf_counter() - start, worker.metrics.bytes_sent / 1e6])
    return None if table is None else Run(spec, curve, float(table[:, 0].max()), table[:, 1])


def shown_epochs(epochs: int) -> list[int]:
    """At most 8 epochs for the table's columns, evenly spread, the first and the last among them."""
    return sorted({int(round(e)) for e in np.linspace(1, epochs, min(epochs, 8))})


def markdown(runs: dict[str, list[Run]], args: argparse.Namespace, size: int) -> str:
    shown = shown_epochs(args.epochs)
    lines = [
        START,
        f"{size} workers, {args.epochs} epochs, digits on {args.features} random ReLU features, batch "
        f"{args.batch_size} per worker, SGD lr {args.lr} for every strategy, {args.compute_ms:g} ms of emulated "
        f"compute per step (a sleep); {args.repeats} rounds over the strategies, medians shown. Written by:",
        "",
        f"`{command_line(size)}`",
        "",
        "Test accuracy of the consensus model (the average of all workers' parameters) after the epochs named, the "
        "lowest and highest final accuracy over the rounds, the wall-clock from the common start to the last "
        "worker's end, and the MB each worker sent (the least, the mean, the most: a server's link is the most).",
        "",
        "| strategy | " + " | ".join(f"epoch {e}" for e in shown) + " | final (range) | wall-clock s | MB sent "
        "(min / mean / max) |",
        "|---" * (len(shown) + 4) + "|",
    ]
    for spec, rounds in runs.items():
        curve = np.median([r.curve for r in rounds], axis=0)
        finals = [r.curve[-1] for r in rounds]
        mb = rounds[0].mb_sent
        cells = " | ".join(f"{curve[e - 1]:.3f}" for e in shown)
        wall = statistics.median(r.wall for r in rounds)
        lines.append(
            f"| `{spec}` | {cells} | {min(finals):.3f}-{max(finals):.3f} | {wall:.1f} | "
            f"{mb.min():.1f} / {mb.mean():.1f} / {mb.max():.1f} |"
        )
    return "\n".join([*lines, END])


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    task = load_task(comm.Get_rank(), comm.Get_size(), args.features)
    runs: dict[str, list[Run]] = {spec: [] for spec in args.strategies}
    for _ in range(args.repeats):  # rounds over all strategies: machine noise hits each alike
        for spec in args.strategies:
            result = run(comm, spec, task, args)
            if result is not None:
                runs[spec].append(result)
                curve = [round(a, 3) for a in result.curve]
                print(f"{spec}: accuracy per epoch {curve}, {result.wall:.1f} s", flush=True)
    if comm.Get_rank() == 0:
        text = markdown(runs, args, comm.Get_size())
        print(text)
        if args.out is not None:
            write_section(args.out, "fast_experiment", text)


if __name__ == "__main__":
    main()
