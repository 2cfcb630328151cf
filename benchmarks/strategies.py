"""Job samples/s and accuracy of every strategy with and without one straggler, side by side with all-reduce.

Every rank trains softmax regression on random ReLU features of its shard of scikit-learn's digits, and every run
trains the same shared budget of ``--epochs`` global epochs (samples summed over the ranks, ``fast_core.Budget``;
every rank claims each batch): lockstep strategies run equal steps, under an asynchronous one a faster rank trains
more of it. The real computation per step is well under a millisecond, so each step also sleeps ``--compute-ms`` to
stand in for a real model's forward and backward pass (a sleep uses no CPU, which keeps 4 ranks on 2 cores fair);
the straggler rank sleeps ``--straggler`` times as long, the same seconds per step under every strategy. Figures are
the job's (benchmarks/job_figures.py): wall-clock from the common start to the last rank's stop, samples/s over it,
the consensus model's final test accuracy; per-rank rates are named so. Each strategy runs twice, once with no
straggler and once with one, in rounds over all strategies (``--repeats``), medians reported.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py benchmarks/strategies.py --out docs/benchmarks.md
    ... benchmarks/strategies.py --strategy allreduce --strategy easgd:tau=4,synchronous=false --epochs 10

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
from job_figures import Job, RankSpan, gather_job
from mpi4py import MPI
from report import command_line, markers, write_section

import fast_core
from fast_core.data.datasets import batches, digits, shard_indices, train_test_split
from fast_core.engine.capabilities import count_wait
from fast_core.engine.metered import unmetered
from fast_core.model.numpy_model import SGD, SoftmaxRegression
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
"""Asynchronous jobs should keep at least this fraction of the best they can keep of their straggler-free job
samples/s with one straggler (``ideal``)."""


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
    parser.add_argument(
        "--epochs", type=float, default=5.0, help="global epochs: the shared budget is this x the training set"
    )
    parser.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step (a sleep)")
    parser.add_argument("--straggler", type=float, default=3.0, help="how many times slower the straggler is")
    parser.add_argument("--straggler-rank", type=int, help="which rank straggles (default: the last)")
    parser.add_argument("--features", type=int, default=4096, help="random ReLU features (0: the 64 raw pixels)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all strategies; medians reported")
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
        count_wait(ctx.engine, time.perf_counter() - start)
        ctx.metrics.bytes_sent += int(2 * grads.nbytes * (size - 1) / size)
        grads *= 1.0 / size


def build_strategy(spec: str) -> Strategy:
    """This benchmark's own ``none`` and ``mpi-allreduce``, or any strategy string of fast_core."""
    if spec == NONE:
        return Strategy()
    return MPIAllReduce() if spec == RAW else fast_core.make_strategy(spec)


def is_asynchronous(strategy: Strategy) -> bool:
    """True for the strategies that are not lockstep: under the budget a faster rank trains more of it."""
    return not strategy.lockstep


# one run --------------------------------------------------------------------------------------------------------

EXTRA = ("cpu_seconds", "bytes_sent", "wait_seconds", "staleness")
"""What each rank adds to its job figures (gather_job's extra columns); staleness NaN: none recorded."""


def train(
    worker: fast_core.Worker,
    model: SoftmaxRegression,
    task: Task,
    args: argparse.Namespace,
    sleep_s: float,
    span: RankSpan,
) -> tuple[int, float]:
    """Claim batches until the job's budget is spent, each step with ``sleep_s`` of emulated compute after the
    gradient; at the end of each pass over the shard tell the worker the validation accuracy (FAST restarts from
    the best replica then), where every rank takes part (``collective_passes``). Returns steps and CPU seconds."""
    stream = batch_stream(task, args.batch_size, seed=worker.engine.rank)
    epoch_steps = len(task.y_train) // args.batch_size
    restarts = worker.claims.collective_passes(args.global_epoch, args.batch_size)
    steps, cpu = 0, time.process_time()
    span.start()
    while (n := worker.claim_batch(args.batch_size)) > 0:
        x, y = next(stream)
        model.compute_gradients(x[:n], y[:n])
        time.sleep(sleep_s)
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
        span.step_end()
        steps += 1
        if steps % epoch_steps == 0 and (restarts is None or steps // epoch_steps <= restarts):
            worker.end_epoch(model.accuracy(task.x_val, task.y_val))
    return steps, time.process_time() - cpu


def run_once(comm: MPI.Comm, spec: str, task: Task, args: argparse.Namespace, slowdown: float) -> Job | None:
    """Train a fresh model with ``spec`` under the budget, the straggler sleeping ``slowdown`` times as long per
    step; rank 0 gets the Job."""
    rank = comm.Get_rank()
    engine = fast_core.mpi_engine(comm, timeout=fast_core.run_config().timeout)
    model = SoftmaxRegression(task.x_train.shape[1], 10, optimizer=SGD(args.lr), seed=0)
    budget = fast_core.Budget(samples=int(args.epochs * args.global_epoch))
    worker = fast_core.Worker(model, build_strategy(spec), engine, budget=budget, observers=[]).start()
    factor = slowdown if rank == args.straggler_rank else 1.0
    span = RankSpan()
    comm.Barrier()
    steps, cpu_seconds = train(worker, model, task, args, args.compute_ms / 1e3 * factor, span)
    wait = worker.metrics.wait_seconds  # while training (closing waits for the last rank's last step)
    worker.close()
    final = worker.group.average_params()
    m = worker.metrics
    staleness = m.staleness_sum / m.staleness_count if m.staleness_count else np.nan
    extra = [cpu_seconds, m.bytes_sent, wait, staleness]
    job = gather_job(comm, span, m.samples, steps, final, lambda p: model.accuracy(task.x_test, task.y_test, p), extra)
    comm.Barrier()
    return job


# summary --------------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One strategy under one condition, medians over the repeats. Per step and per-rank figures are means over
    the ranks other than the straggler, each over its own steps and its own time."""

    wall: float  # the job's wall-clock: the earliest rank's start to the last rank's stop
    job_rate: float  # the job's samples/s: all ranks' samples over that wall-clock
    rank_rate: float  # per-rank steps/s of the other ranks
    straggler_rate: float  # the straggler's per-rank steps/s
    kb_per_step: float
    wait_ms: float  # ms per step spent waiting on peers
    cpu_ms: float  # CPU ms per step of the whole process
    staleness: float | None
    accuracy: float  # the consensus model's test accuracy at the end


def summarize(jobs: Sequence[Job], straggler: int) -> Cell:
    def per_run(job: Job) -> tuple[float, ...]:
        others = [r for r in range(len(job.steps)) if r != straggler]
        steps = np.array(job.steps, dtype=float)

        def per_step(name: str) -> float:
            return float(np.mean(job.extra[others, EXTRA.index(name)] / np.maximum(steps[others], 1.0)))

        stale = job.extra[others, EXTRA.index("staleness")]
        return (
            job.wall,
            job.samples_per_second,
            job.per_rank(steps, others),
            job.per_rank(steps, [straggler]),
            per_step("bytes_sent") / 1e3,
            per_step("wait_seconds") * 1e3,
            per_step("cpu_seconds") * 1e3,
            float(np.nanmean(stale)) if not np.isnan(stale).all() else np.nan,
        )

    columns = list(zip(*(per_run(job) for job in jobs), strict=True))
    stale = [s for s in columns[7] if not np.isnan(s)]
    return Cell(
        *(statistics.median(column) for column in columns[:7]),
        staleness=statistics.median(stale) if stale else None,
        accuracy=statistics.median(job.final_accuracy for job in jobs),
    )


@dataclass
class Row:
    spec: str
    asynchronous: bool
    alone: Cell
    straggling: Cell

    @property
    def kept(self) -> float:
        """The job's samples/s with the straggler over its samples/s without."""
        return self.straggling.job_rate / self.alone.job_rate


def ideal(ranks: int, slowdown: float) -> float:
    """What an asynchronous job keeps of its samples/s when one of ``ranks`` runs ``slowdown`` times slower and the
    others lose nothing: (ranks - 1 + 1/slowdown) / ranks. A lockstep job keeps 1/slowdown."""
    return (ranks - 1 + 1 / slowdown) / ranks


def goal(row: Row, slowdown: float, ranks: int) -> str:
    if row.asynchronous:
        return "yes" if row.kept >= KEEP_GOAL * ideal(ranks, slowdown) else "no"
    if row.spec in (RAW, "allreduce"):
        return f"≈ {1 / slowdown:.2f} expected"
    return ""


def table(rows: Sequence[Row], slowdown: float, ranks: int) -> str:
    lines = [
        "| strategy | mode | job wall-clock s (alone / straggler) | job samples/s alone | job samples/s with "
        "straggler | kept | goal | per-rank steps/s (alone / straggler) | straggler's per-rank steps/s | kB sent/step "
        "| wait ms/step (alone / straggler) | CPU ms/step alone | staleness (alone / straggler) "
        "| final accuracy, consensus model (alone / straggler) |",
        "|---|---|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, s = r.alone, r.straggling
        mode = "–" if r.spec == NONE else ("async" if r.asynchronous else "sync")
        stale = "–" if a.staleness is None and s.staleness is None else f"{_opt(a.staleness)} / {_opt(s.staleness)}"
        lines.append(
            f"| `{r.spec}` | {mode} | {a.wall:.2f} / {s.wall:.2f} | {a.job_rate:.0f} | {s.job_rate:.0f} "
            f"| {r.kept:.2f} | {goal(r, slowdown, ranks)} | {a.rank_rate:.1f} / {s.rank_rate:.1f} "
            f"| {s.straggler_rate:.1f} | {a.kb_per_step:.0f} | {a.wait_ms:.2f} / {s.wait_ms:.2f} | {a.cpu_ms:.2f} "
            f"| {stale} | {a.accuracy:.3f} / {s.accuracy:.3f} |"
        )
    return "\n".join(lines)


def _opt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def reading(rows: Sequence[Row], slowdown: float, ranks: int, epoch_steps: int) -> str:
    """One paragraph reading the measured numbers against the goal, whatever they are."""
    best = ideal(ranks, slowdown)
    asyncs = [r for r in rows if r.asynchronous]
    met = [r for r in asyncs if r.kept >= KEEP_GOAL * best]
    missed = [r for r in asyncs if r.kept < KEEP_GOAL * best]
    kept = ", ".join(f"`{r.spec}` {r.kept:.2f}" for r in asyncs)
    text = [
        f"Goal: with one of {ranks} ranks {slowdown:g}x slower, an asynchronous job keeps ≥ {KEEP_GOAL:.0%} of "
        f"the best it can keep, ({ranks - 1} + 1/{slowdown:g}) / {ranks} = {best:.2f} of its straggler-free job "
        f"samples/s (the other ranks losing nothing), so ≥ {KEEP_GOAL * best:.2f}; a lockstep job drops to about "
        f"1/{slowdown:g}. Measured for the asynchronous strategies: {kept}; "
    ]
    if not missed:
        text.append("all of them meet the goal. " if asyncs else "")
    else:
        names = ", ".join(f"`{r.spec}`" for r in missed)
        text.append(f"{len(met)} of {len(asyncs)} meet it, {names} do{'es' if len(missed) == 1 else ''} not. ")
    for base in (r for r in rows if r.spec in (RAW, "allreduce")):
        what = "All-reduce on raw mpi4py" if base.spec == RAW else "FAST's all-reduce"
        text.append(
            f"{what} keeps {base.kept:.2f} ({base.alone.job_rate:.0f} → {base.straggling.job_rate:.0f} job "
            f"samples/s, {base.alone.wait_ms:.1f} ms/step waiting without a straggler) against 1/{slowdown:g} = "
            f"{1 / slowdown:.2f} expected. "
        )
    syncs = [r for r in rows if not r.asynchronous and r.spec not in (NONE, RAW, "allreduce")]
    if syncs:
        text.append(
            "The other lockstep strategies keep "
            + ", ".join(f"`{r.spec}` {r.kept:.2f}" for r in syncs)
            + ": they wait for the straggler whenever they meet it. "
        )
    text.append(accuracy_note(rows))
    if any(r.spec.startswith("fast") for r in rows):
        text.append(
            "FAST restarts every worker from the best replica at the end of each pass over a rank's shard (here "
            f"every {epoch_steps} steps) that every rank finishes before the budget is spent; that restart is "
            "collective, so with a straggler the others wait for it once a pass, and between restarts the replicas "
            "drift apart, because no parameters are mixed and each worker applies more of its neighbours' gradients "
            "than its own (README, 'A note on FAST'). "
        )
    ceiling = next((r for r in rows if r.spec == NONE), None)
    if ceiling is not None and asyncs:
        fastest = max(asyncs, key=lambda r: r.alone.job_rate)
        text.append(
            f"With no communication at all the job runs {ceiling.alone.job_rate:.0f} samples/s; the fastest "
            f"asynchronous strategy without a straggler, `{fastest.spec}`, runs {fastest.alone.job_rate:.0f} "
            f"({fastest.alone.job_rate / ceiling.alone.job_rate:.2f} of that)."
        )
    return "".join(text).strip()


def accuracy_note(rows: Sequence[Row], tolerance: float = 0.05) -> str:
    """Name the strategies whose consensus model ends far below all-reduce's accuracy (a sentence, or nothing)."""
    reference = next((r for r in rows if r.spec in ("allreduce", RAW)), None)
    if reference is None:
        return ""
    target = reference.alone.accuracy
    low = [r for r in rows if min(r.alone.accuracy, r.straggling.accuracy) < target - tolerance]
    if not low:
        return f"Every consensus model ends within {tolerance} of all-reduce's test accuracy ({target:.3f}). "
    names = ", ".join(f"`{r.spec}` {r.alone.accuracy:.3f} / {r.straggling.accuracy:.3f}" for r in low)
    return (
        f"Consensus-model accuracy more than {tolerance} below all-reduce's {target:.3f} (alone / straggler): {names}. "
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
            f"{params * 8 / 1e3:.0f} kB per message), each rank on its own shard ({epoch_steps} steps a pass, "
            f"after which the worker gets the validation accuracy), batch {args.batch_size}, SGD lr {args.lr}. "
            f"Every run trains the same shared budget of {args.epochs:g} global epochs ({args.budget:,} samples "
            "summed over the ranks, `fast_core.Budget`; every rank claims each batch): lockstep strategies run "
            "equal steps, under an asynchronous one a faster rank trains more of the budget and all stop together. "
            "The real computation per step is well under a millisecond, so each step sleeps "
            f"{args.compute_ms:g} ms after computing its gradient to stand in for a real model's compute (a sleep "
            "leaves the CPU to the communication threads, so the 4 ranks share 2 cores fairly). With a straggler, "
            f"rank {args.straggler_rank} sleeps {args.straggler:g}x as long ({args.compute_ms * args.straggler:g} "
            f"ms): the same {args.compute_ms * (args.straggler - 1):g} ms more per step under every strategy. "
            "Job wall-clock: from the earliest rank's start (after the worker's collective start and a barrier) "
            "to the last rank's stop (its last step's end); job samples/s: all ranks' samples over that "
            "wall-clock; kept = job samples/s with the straggler / without. Per-rank steps/s (each rank's steps "
            "over its own time), kB sent, wait while training and staleness (steps behind of what a rank mixed) "
            "are means over the ranks other than the straggler, per step of each. Final accuracy: the test "
            "accuracy of the "
            f"consensus model (the mean of all ranks' parameters) after the run. Medians over {args.repeats} rounds "
            "that run every strategy in turn, without then with the straggler; `none` trains with no communication "
            "at all (the ceiling without a straggler; it is lockstep under the budget, equal steps per rank, so "
            "with one the job waits for the straggler's last step).",
            "",
            table(rows, args.straggler, ranks),
            "",
            reading(rows, args.straggler, ranks, epoch_steps),
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
    args.global_epoch = int(comm.allreduce(len(task.y_train)))  # the samples of all shards: one global epoch
    args.budget = int(args.epochs * args.global_epoch)
    runs: dict[tuple[str, float], list[Job]] = {}
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
            summarize(runs[spec, 1.0], args.straggler_rank),
            summarize(runs[spec, args.straggler], args.straggler_rank),
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
