"""Steps/s and accuracy of every strategy with and without one straggler, side by side with all-reduce.

Every rank trains softmax regression on random ReLU features of its shard of scikit-learn's digits for a fixed
number of steps. The real computation per step is well under a millisecond, so each step also sleeps
``--compute-ms`` to stand in for a real model's forward and backward pass (a sleep uses no CPU, which keeps 4 ranks
on 2 cores fair); the straggler rank sleeps ``--straggler`` times as long. Each strategy runs twice, once with no
straggler and once with one, in rounds over all strategies (``--repeats``), medians reported.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py benchmarks/strategies.py --out docs/benchmarks.md
    ... benchmarks/strategies.py --strategy allreduce --strategy easgd:tau=4,synchronous=false --steps 200

``--strategy`` may be repeated (a strategy string contains commas, so the flag is the separator).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI
from report import command_line, gather_to_root, markers, write_section

import fast_core
from fast_core.datasets import batches, digits, shard_indices, train_test_split
from fast_core.engine.metered import unmetered
from fast_core.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies import STRATEGIES, Strategy
from fast_core.strategies.base import StepContext

START, END = markers("strategies")
NONE = "none"
"""The ceiling: every rank trains alone, no communication at all."""
RAW = "mpi-allreduce"
"""All-reduce SGD on mpi4py's blocking ``Allreduce``, bypassing FAST's engine: the baseline as Horovod runs it."""
BASE_STRATEGIES = [
    NONE,
    RAW,
    "allreduce",
    "localsgd:period=4",
    "dpsgd:ring",
    "sgp:exp1",
    "async:torus",
    "fast:torus",
    "adpsgd:ring",
    "easgd:tau=4",
    "easgd:tau=4,synchronous=false",
]
GOSSIP_STRATEGIES = ["gossip", "gossip:synchronous=false", "gossip:push,synchronous=false"]
KEEP_GOAL = 0.9
"""Asynchronous strategies should keep at least this fraction of their straggler-free speed."""


def default_strategies() -> list[str]:
    """The base list, plus gossip when this build of fast_core has it."""
    return BASE_STRATEGIES + (GOSSIP_STRATEGIES if "gossip" in STRATEGIES else [])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--strategy",
        dest="strategies",
        action="append",
        metavar="SPEC",
        help=f"a strategy string, repeat the flag for several ('{NONE}': no communication); default: all",
    )
    parser.add_argument("--steps", type=int, default=100, help="training steps per rank and run")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step (a sleep)")
    parser.add_argument("--straggler", type=float, default=3.0, help="how many times slower the straggler is")
    parser.add_argument("--straggler-rank", type=int, help="which rank straggles (default: the last)")
    parser.add_argument("--features", type=int, default=4096, help="random ReLU features (0: the 64 raw pixels)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over all strategies; medians reported")
    parser.add_argument("--out", type=Path, help="Markdown file whose strategies section is written or replaced")
    args = parser.parse_args(argv)
    args.strategies = args.strategies or default_strategies()
    return args


# data and model ---------------------------------------------------------------------------------------------------


@dataclass
class Task:
    """This rank's training shard and the shared test set, already mapped to features."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray  # the same on every rank: what a strategy's end_epoch(metric) sees (FAST's restarts)
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def feature_map(n_features: int, seed: int = 1):
    """x -> relu(x R + b) scaled so the feature norm matches the raw pixels'; identity for ``n_features=0``."""
    if n_features == 0:
        return lambda x: x
    rng = np.random.default_rng(seed)
    weights, bias = rng.normal(0.0, 1 / 8, (64, n_features)), rng.normal(0.0, 0.5, n_features)
    scale = np.sqrt(64 / n_features)
    return lambda x: np.maximum(x @ weights + bias, 0.0) * scale


def load_task(rank: int, size: int, n_features: int) -> Task:
    """Digits split 80/20 the same way on every rank, a tenth of the training part held out for validation; each
    rank keeps its own shard of the rest."""
    x, y = digits()
    x_train, y_train, x_test, y_test = train_test_split(x, y, test_fraction=0.2, seed=0)
    x_train, y_train, x_val, y_val = train_test_split(x_train, y_train, test_fraction=0.1, seed=1)
    mine = shard_indices(len(y_train), rank, size, seed=0, drop_last=True)
    features = feature_map(n_features)
    return Task(features(x_train[mine]), y_train[mine], features(x_val), y_val, features(x_test), y_test)


def batch_stream(task: Task, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Mini-batches of the shard, epoch after epoch, without end."""
    epoch = 0
    while True:
        yield from batches(task.x_train, task.y_train, batch_size, epoch=epoch, seed=seed)
        epoch += 1


class MPIAllReduce(Strategy):
    """All-reduce SGD with a blocking ``comm.Allreduce`` straight from mpi4py, beside the engine: the baseline's
    traffic and wait are added to the metrics as the metering engine would count them."""

    name = RAW
    uses_gradients = True

    def before_step(self, ctx: StepContext) -> None:
        grads, size = ctx.model.grads(), ctx.size
        start = time.perf_counter()
        unmetered(ctx.engine).comm.Allreduce(MPI.IN_PLACE, grads)
        ctx.engine.record_wait(time.perf_counter() - start)
        ctx.metrics.bytes_sent += int(2 * grads.nbytes * (size - 1) / size)
        grads *= 1.0 / size


def build_strategy(spec: str) -> Strategy:
    """This benchmark's own ``none`` and ``mpi-allreduce``, or any strategy string of fast_core."""
    if spec == NONE:
        return Strategy()
    return MPIAllReduce() if spec == RAW else fast_core.make_strategy(spec)


def is_asynchronous(strategy: Strategy) -> bool:
    """True for the strategies whose trainer never waits for a peer's trainer."""
    if strategy.name in ("async", "adpsgd"):
        return True
    return getattr(strategy, "synchronous", True) is False


# one run --------------------------------------------------------------------------------------------------------


@dataclass
class RankRun:
    """What one rank measured in one run."""

    seconds: float  # its own time for its steps, from the common start
    cpu_seconds: float  # CPU time of the whole process (trainer and communication threads) meanwhile
    bytes_sent: int
    wait_seconds: float
    staleness: float | None  # mean steps behind of what it mixed; None when the strategy records none


@dataclass
class Run:
    """One strategy, one condition: every rank's measurements and the averaged model's test accuracy."""

    ranks: list[RankRun]
    accuracy: float


def train(
    worker: fast_core.Worker, model: SoftmaxRegression, task: Task, args: argparse.Namespace, sleep_s: float
) -> tuple[float, float]:
    """Run ``steps`` steps, each with ``sleep_s`` of emulated compute after the gradient, and tell the worker when
    an epoch of the shard ends, with the validation accuracy (FAST restarts from the best replica then); return
    wall and CPU seconds."""
    stream = batch_stream(task, args.batch_size, seed=worker.rank)
    epoch_steps = len(task.y_train) // args.batch_size
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(args.steps):
        x, y = next(stream)
        model.compute_gradients(x, y)
        time.sleep(sleep_s)
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
        if (step + 1) % epoch_steps == 0:
            worker.end_epoch(model.accuracy(task.x_val, task.y_val))
    return time.perf_counter() - start, time.process_time() - cpu


def run_once(comm: MPI.Comm, spec: str, task: Task, args: argparse.Namespace, slowdown: float) -> Run | None:
    """Train a fresh model with ``spec``, the straggler computing ``slowdown`` times longer; rank 0 gets the Run."""
    rank = comm.Get_rank()
    engine = fast_core.mpi_engine(comm)
    model = SoftmaxRegression(task.x_train.shape[1], 10, optimizer=SGD(args.lr), seed=0)
    worker = fast_core.Worker(model, build_strategy(spec), engine).start()
    factor = slowdown if rank == args.straggler_rank else 1.0
    comm.Barrier()
    seconds, cpu_seconds = train(worker, model, task, args, args.compute_ms / 1e3 * factor)
    worker.close()
    accuracy = model.accuracy(task.x_test, task.y_test, worker.average_params())
    m = worker.metrics
    staleness = m.staleness_sum / m.staleness_count if m.staleness_count else None
    # numbers travel as a float64 array (never a pickle); NaN stands for "no staleness recorded"
    table = gather_to_root(
        comm, [seconds, cpu_seconds, m.bytes_sent, m.wait_seconds, np.nan if staleness is None else staleness]
    )
    comm.Barrier()
    if rank != 0:
        return None
    ranks = [RankRun(r[0], r[1], int(r[2]), r[3], None if np.isnan(r[4]) else float(r[4])) for r in table]
    return Run(ranks, accuracy)


# summary --------------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One strategy under one condition, for the ranks that are not the straggler, median over the repeats."""

    rate: float  # mean steps/s of the other ranks
    straggler_rate: float  # the straggler rank's own steps/s
    kb_per_step: float  # kB sent per step, mean of the other ranks
    wait_ms: float  # ms per step spent waiting on peers, mean of the other ranks
    cpu_ms: float  # CPU ms per step of the whole process, mean of the other ranks
    staleness: float | None
    accuracy: float


def summarize(runs: Sequence[Run], steps: int, straggler: int) -> Cell:
    def per_run(run: Run) -> tuple[float, float, float, float, float, float | None]:
        others = [r for i, r in enumerate(run.ranks) if i != straggler]
        stale = [r.staleness for r in others if r.staleness is not None]
        return (
            statistics.fmean(steps / r.seconds for r in others),
            steps / run.ranks[straggler].seconds,
            statistics.fmean(r.bytes_sent for r in others) / steps / 1e3,
            statistics.fmean(r.wait_seconds for r in others) / steps * 1e3,
            statistics.fmean(r.cpu_seconds for r in others) / steps * 1e3,
            statistics.fmean(stale) if stale else None,
        )

    rows = [per_run(run) for run in runs]
    columns = list(zip(*rows, strict=True))
    stale = [s for s in columns[5] if s is not None]
    return Cell(
        rate=statistics.median(columns[0]),
        straggler_rate=statistics.median(columns[1]),
        kb_per_step=statistics.median(columns[2]),
        wait_ms=statistics.median(columns[3]),
        cpu_ms=statistics.median(columns[4]),
        staleness=statistics.median(stale) if stale else None,
        accuracy=statistics.median(run.accuracy for run in runs),
    )


@dataclass
class Row:
    spec: str
    asynchronous: bool
    alone: Cell
    straggling: Cell

    @property
    def kept(self) -> float:
        return self.straggling.rate / self.alone.rate


def goal(row: Row, slowdown: float) -> str:
    if row.asynchronous:
        return "yes" if row.kept >= KEEP_GOAL else "no"
    if row.spec in (RAW, "allreduce"):
        return f"≈ {1 / slowdown:.2f} expected"
    return ""


def table(rows: Sequence[Row], slowdown: float) -> str:
    lines = [
        "| strategy | mode | steps/s alone | steps/s with straggler | kept | goal | straggler's steps/s | kB sent/step "
        "| wait ms/step (alone / straggler) | CPU ms/step alone | staleness (alone / straggler) "
        "| accuracy (alone / straggler) |",
        "|---|---|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, s = r.alone, r.straggling
        mode = "–" if r.spec == NONE else ("async" if r.asynchronous else "sync")
        stale = "–" if a.staleness is None and s.staleness is None else f"{_opt(a.staleness)} / {_opt(s.staleness)}"
        lines.append(
            f"| `{r.spec}` | {mode} | {a.rate:.1f} | {s.rate:.1f} | {r.kept:.2f} | {goal(r, slowdown)} "
            f"| {s.straggler_rate:.1f} | {a.kb_per_step:.0f} | {a.wait_ms:.2f} / {s.wait_ms:.2f} | {a.cpu_ms:.2f} "
            f"| {stale} | {a.accuracy:.3f} / {s.accuracy:.3f} |"
        )
    return "\n".join(lines)


def _opt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def reading(rows: Sequence[Row], slowdown: float, epoch_steps: int) -> str:
    """One paragraph reading the measured numbers against the goal, whatever they are."""
    asyncs = [r for r in rows if r.asynchronous]
    met = [r for r in asyncs if r.kept >= KEEP_GOAL]
    missed = [r for r in asyncs if r.kept < KEEP_GOAL]
    kept = ", ".join(f"`{r.spec}` {r.kept:.2f}" for r in asyncs)
    text = [f"Goal: asynchronous strategies keep ≥ {KEEP_GOAL:.0%} of their straggler-free speed, all-reduce drops to "]
    text.append(f"about 1/{slowdown:g}. Measured for the asynchronous strategies: {kept}; ")
    if not missed:
        text.append("all of them meet the goal. ")
    else:
        names = ", ".join(f"`{r.spec}`" for r in missed)
        text.append(f"{len(met)} of {len(asyncs)} meet it, {names} do{'es' if len(missed) == 1 else ''} not. ")
    for base in (r for r in rows if r.spec in (RAW, "allreduce")):
        what = "All-reduce on raw mpi4py" if base.spec == RAW else "FAST's all-reduce"
        text.append(
            f"{what} keeps {base.kept:.2f} ({base.alone.rate:.1f} → {base.straggling.rate:.1f} steps/s, "
            f"{base.alone.wait_ms:.1f} ms/step waiting without a straggler) against 1/{slowdown:g} = "
            f"{1 / slowdown:.2f} expected. "
        )
    syncs = [r for r in rows if not r.asynchronous and r.spec not in (NONE, RAW, "allreduce")]
    if syncs:
        text.append(
            "The other synchronous strategies keep "
            + ", ".join(f"`{r.spec}` {r.kept:.2f}" for r in syncs)
            + ": they wait for the straggler whenever they meet it. "
        )
    text.append(accuracy_note(rows))
    if any(r.spec.startswith("fast") for r in rows):
        text.append(
            "FAST restarts every worker from the best replica at each epoch end (a pass over a rank's shard, "
            f"here every {epoch_steps} steps); that restart is collective, so with a straggler the others wait for "
            "it once an epoch, and between restarts the replicas drift apart, because no parameters are mixed and "
            "each worker applies more of its neighbours' gradients than its own (README, 'A note on FAST'). "
        )
    ceiling = next((r for r in rows if r.spec == NONE), None)
    if ceiling is not None and asyncs:
        best = max(r.alone.rate for r in asyncs)
        text.append(
            f"With no communication at all a rank runs {ceiling.alone.rate:.1f} steps/s; the fastest asynchronous "
            f"strategy without a straggler runs {best:.1f} ({best / ceiling.alone.rate:.2f} of that)."
        )
    return "".join(text).strip()


def accuracy_note(rows: Sequence[Row], tolerance: float = 0.05) -> str:
    """Name the strategies whose averaged model ends far below all-reduce's accuracy (a sentence, or nothing)."""
    reference = next((r for r in rows if r.spec in ("allreduce", RAW)), None)
    if reference is None:
        return ""
    target = reference.alone.accuracy
    low = [r for r in rows if min(r.alone.accuracy, r.straggling.accuracy) < target - tolerance]
    if not low:
        return f"Every averaged model ends within {tolerance} of all-reduce's test accuracy ({target:.3f}). "
    names = ", ".join(f"`{r.spec}` {r.alone.accuracy:.3f} / {r.straggling.accuracy:.3f}" for r in low)
    return (
        f"Averaged-model accuracy more than {tolerance} below all-reduce's {target:.3f} (alone / straggler): {names}. "
    )


def section(rows: Sequence[Row], args: argparse.Namespace, ranks: int, params: int, epoch_steps: int) -> str:
    """The Markdown section this benchmark owns, markers included."""
    library = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    model = f"{args.features} random ReLU features" if args.features else "the 64 raw pixels"
    return "\n".join(
        [
            START,
            "## Strategies with and without a straggler (`benchmarks/strategies.py`)",
            "",
            f"`{command_line(ranks)}`",
            "",
            f"{library}, {ranks} ranks, {os.cpu_count()} CPUs, NumPy {np.__version__}, {datetime.date.today()}.",
            "",
            f"Softmax regression on {model} of scikit-learn's digits ({params:,} float64 parameters, "
            f"{params * 8 / 1e3:.0f} kB per message), each rank on its own shard ({epoch_steps} steps an epoch, "
            f"after which the worker gets the validation accuracy), batch {args.batch_size}, SGD "
            f"lr {args.lr}, {args.steps} steps per rank and run. The real computation per step is well under a "
            f"millisecond, so each step sleeps {args.compute_ms:g} ms after computing its gradient to stand in for "
            "a real model's compute (a sleep leaves the CPU to the communication threads, so the 4 ranks share 2 "
            f"cores fairly). With a straggler, rank {args.straggler_rank} sleeps {args.straggler:g}x as long "
            f"({args.compute_ms * args.straggler:g} ms). Every rank times its own {args.steps} steps from a common "
            "barrier, so in asynchronous runs the fast ranks finish before the straggler. Steps/s, kB sent, wait "
            "and staleness (steps behind of what a rank mixed) are means over the ranks other than the straggler; "
            "kept = steps/s with the straggler / steps/s alone; accuracy is the test accuracy of the mean of all "
            f"ranks' parameters after the run. Medians over {args.repeats} rounds that run every strategy in turn, "
            "without then with the straggler; `none` trains with no communication at all (the ceiling).",
            "",
            table(rows, args.straggler),
            "",
            reading(rows, args.straggler, epoch_steps),
            END,
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        sys.exit("run with several ranks: mpiexec -n 4 python -m mpi4py benchmarks/strategies.py")
    args.straggler_rank = size - 1 if args.straggler_rank is None else args.straggler_rank
    for spec in args.strategies:  # fail on a typo now, not after minutes of running
        build_strategy(spec)
    task = load_task(rank, size, args.features)
    runs: dict[tuple[str, float], list[Run]] = {}
    for round_ in range(args.repeats):
        for spec in args.strategies:
            for slowdown in (1.0, args.straggler):
                run = run_once(comm, spec, task, args, slowdown)
                if run is not None:
                    runs.setdefault((spec, slowdown), []).append(run)
            if rank == 0:
                print(f"round {round_ + 1}/{args.repeats}: {spec} done", file=sys.stderr, flush=True)
    if rank != 0:
        return
    rows = [
        Row(
            spec,
            spec != NONE and is_asynchronous(build_strategy(spec)),
            summarize(runs[spec, 1.0], args.steps, args.straggler_rank),
            summarize(runs[spec, args.straggler], args.steps, args.straggler_rank),
        )
        for spec in args.strategies
    ]
    params = (task.x_train.shape[1] + 1) * 10
    text = section(rows, args, size, params, len(task.y_train) // args.batch_size)
    print(text)
    if args.out:
        write_section(args.out, "strategies", text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
