"""fast_torch against PyTorch DistributedDataParallel: the same model, data and work budget, in one MPI job.

Every rank trains the same MLP (float32, a few hundred thousand parameters) on its own shard of scikit-learn's
digits, once with ``torch.nn.parallel.DistributedDataParallel`` on the gloo backend and once per fast_core strategy
through ``fast_torch.DistributedOptimizer``, each without and with one straggler. Both systems live in the same
``mpiexec`` job: torch.distributed is initialised from mpi4py's rank and size (MASTER_ADDR 127.0.0.1, a free port
chosen by rank 0 and broadcast with MPI), so the runs interleave — DDP, the FAST strategies, DDP again, ... — and
machine noise hits both alike. The real computation per step is about a millisecond, so each step first sleeps
``--compute-ms`` to stand in for a larger model's forward and backward pass (a sleep leaves the CPU free, which
keeps 4 ranks on 2 cores fair); the straggler sleeps ``--straggler`` times as long, the same seconds per step
under every system. Every run trains the same shared budget of ``--epochs`` global epochs. Figures are the job's
(benchmarks/job_figures.py): wall-clock from the common start to the last rank's stop, samples/s over it, time to
target and final accuracy of the consensus (averaged) model; per-rank rates are named so.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py benchmarks/torch_vs_ddp.py --out docs/benchmarks.md
    ... benchmarks/torch_vs_ddp.py --system ddp --system allreduce --epochs 2 --repeats 1

``--system`` may be repeated: ``ddp`` is DistributedDataParallel, anything else a fast_core strategy string.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from job_figures import Job, RankSpan, gather_job
from mpi4py import MPI
from report import command_line, markers, write_section
from torch.nn.parallel import DistributedDataParallel

import fast_core
import fast_torch as fast
from fast_core.data.datasets import batches, digits, shard_indices, train_test_split
from fast_core.strategies import Strategy

NAME = "torch_vs_ddp"
START, END = markers(NAME)
DDP = "ddp"
NONE = "none"
"""fast_torch's hooks around a strategy that communicates nothing: the ceiling, each rank training alone."""
DEFAULT_SYSTEMS = [DDP, "allreduce", "dpsgd:ring", "async:torus", "sgp:exp1", NONE]
THROUGHPUT_GOAL = 0.9
"""fast_torch's all-reduce should run at least this fraction of DDP's job samples/s."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--system",
        dest="systems",
        action="append",
        metavar="SPEC",
        help=f"'{DDP}', '{NONE}' (no communication) or a fast_core strategy string; repeat the flag for several; "
        f"default: {' '.join(DEFAULT_SYSTEMS)}",
    )
    parser.add_argument(
        "--epochs", type=float, default=10.0, help="global epochs: the shared budget is this x the training set"
    )
    parser.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step (a sleep)")
    parser.add_argument("--straggler", type=float, default=3.0, help="how many times slower the straggler is")
    parser.add_argument("--straggler-rank", type=int, help="which rank straggles (default: the last)")
    parser.add_argument("--hidden", type=int, default=512, help="width of the MLP's two hidden layers")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--target", type=float, default=0.9, help="consensus test accuracy for time to target")
    parser.add_argument("--every-ms", type=float, default=100.0, help="ms between the consensus curve's points")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all systems; medians reported")
    parser.add_argument("--out", type=Path, help="Markdown file whose torch_vs_ddp section is written or replaced")
    args = parser.parse_args(argv)
    args.systems = args.systems or list(DEFAULT_SYSTEMS)
    return args


# data and model ---------------------------------------------------------------------------------------------------


@dataclass
class Task:
    """This rank's training shard and the shared test set, float32."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_task(rank: int, size: int) -> Task:
    """Digits split 80/20 the same way on every rank; each rank keeps its own equal shard of the training part."""
    x, y = digits()
    x_train, y_train, x_test, y_test = train_test_split(x, y, test_fraction=0.2, seed=0)
    mine = shard_indices(len(y_train), rank, size, seed=0, drop_last=True)
    return Task(
        x_train[mine].astype(np.float32),
        y_train[mine],
        torch.from_numpy(x_test.astype(np.float32)),
        torch.from_numpy(y_test),
    )


def batch_stream(task: Task, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches of the shard as tensors, epoch after epoch, without end (the same order for every system)."""
    epoch = 0
    while True:
        for x, y in batches(task.x_train, task.y_train, batch_size, epoch=epoch, seed=seed):
            yield torch.from_numpy(x), torch.from_numpy(y)
        epoch += 1


def make_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)  # the same start everywhere (DDP and fast_torch also broadcast rank 0's parameters)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def accuracy(model: torch.nn.Module, task: Task) -> float:
    with torch.no_grad():
        return float((model(task.x_test).argmax(1) == task.y_test).double().mean())


# torch.distributed inside the MPI job -----------------------------------------------------------------------------


def init_gloo(comm: MPI.Comm) -> None:
    """torch.distributed with gloo over the MPI job's ranks: rank 0 picks a free port, MPI broadcasts it."""
    port = np.zeros(1, dtype=np.int64)
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.Bcast(port, root=0)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(int(port[0]))
    dist.init_process_group(
        "gloo", rank=comm.Get_rank(), world_size=comm.Get_size(), timeout=datetime.timedelta(seconds=300)
    )


# one run ------------------------------------------------------------------------------------------------------------

EXTRA = ("cpu_seconds",)
"""What each rank adds to its job figures (gather_job's extra columns)."""


def flat(model: torch.nn.Module) -> np.ndarray:
    """The model's parameters as one new flat array (a snapshot)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()


def evaluator(task: Task, hidden: int) -> Callable[[np.ndarray], float]:
    """Flat parameters -> test accuracy, on a model of its own (the trained ones are left as they are)."""
    model = make_model(hidden)

    def evaluate(params: np.ndarray) -> float:
        torch.nn.utils.vector_to_parameters(torch.from_numpy(params), model.parameters())
        return accuracy(model, task)

    return evaluate


def lockstep_claims(samples: int, batch_size: int, size: int) -> Callable[[int], int]:
    """DDP's share of the budget: floor(samples / (batch_size x ranks)) steps on every rank, as a lockstep FAST
    strategy counts it (``fast_core.Budget``), without FAST's worker around DDP."""
    left = samples // (batch_size * size)

    def claim(n: int) -> int:
        nonlocal left
        left -= 1
        return n if left >= 0 else 0

    return claim


def train(
    step_model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    claim: Callable[[int], int],
    task: Task,
    args: argparse.Namespace,
    sleep_s: float,
    rank: int,
    span: RankSpan,
) -> tuple[int, int, float]:
    """Claim batches until the job's budget is spent; each step sleeps (the emulated compute), then forward,
    backward, optimizer step. Returns samples, steps and CPU seconds."""
    stream = batch_stream(task, args.batch_size, seed=rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    samples = steps = 0
    cpu = time.process_time()
    span.start()
    while (n := claim(args.batch_size)) > 0:
        x, y = next(stream)
        time.sleep(sleep_s)
        opt.zero_grad()
        loss_fn(step_model(x[:n]), y[:n]).backward()
        opt.step()
        span.step_end()
        samples, steps = samples + n, steps + 1
    return samples, steps, time.process_time() - cpu


def run_once(comm: MPI.Comm, spec: str, task: Task, args: argparse.Namespace, slowdown: float) -> Job | None:
    """Train a fresh model with ``spec`` under the budget, the straggler sleeping ``slowdown`` times as long per
    step; rank 0 gets the Job."""
    rank = comm.Get_rank()
    model = make_model(args.hidden)
    sleep_s = args.compute_ms / 1e3 * (slowdown if rank == args.straggler_rank else 1.0)
    span = RankSpan(params=lambda: flat(model), every_s=args.every_ms / 1e3)
    if spec == DDP:
        step_model = DistributedDataParallel(model)  # broadcasts rank 0's parameters
        opt = torch.optim.SGD(step_model.parameters(), lr=args.lr, momentum=args.momentum)
        claim = lockstep_claims(args.budget, args.batch_size, comm.Get_size())
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        budget = fast_core.Budget(samples=args.budget)
        engine = fast_core.mpi_engine(comm, timeout=fast_core.run_config().timeout)
        opt = fast.DistributedOptimizer(opt, model, build_strategy(spec), engine=engine, budget=budget)  # broadcasts
        step_model, claim = model, opt.fast_worker.claim_batch
    comm.Barrier()
    samples, steps, cpu_seconds = train(step_model, opt, claim, task, args, sleep_s, rank, span)
    if spec == DDP:
        del step_model  # the replicas are identical: their average is any of them
    else:
        fast.average_model(model)  # closes the worker (collective), then the mean of every rank's parameters
    job = gather_job(comm, span, samples, steps, flat(model), evaluator(task, args.hidden), [cpu_seconds])
    comm.Barrier()
    return job


# summary ------------------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One system under one condition, medians over the repeats. Per-rank figures are means over the ranks other
    than the straggler, each over its own steps and its own time."""

    wall: float  # the job's wall-clock: the earliest rank's start to the last rank's stop
    job_rate: float  # the job's samples/s: all ranks' samples over that wall-clock
    rank_rate: float  # per-rank samples/s of the other ranks
    extra_ms: float  # per-rank ms per step beyond the emulated compute
    cpu_ms: float  # CPU ms per step of the whole process
    to_target: float  # s from the common start until the consensus model reached the target; NaN: not in every run
    reached: int  # in how many runs the consensus model reached the target
    accuracy: float  # the consensus model's test accuracy at the end


def summarize(jobs: Sequence[Job], args: argparse.Namespace) -> Cell:
    rows = []
    for job in jobs:
        others = [r for r in range(len(job.steps)) if r != args.straggler_rank]
        steps = np.maximum(np.array(job.steps, dtype=float), 1.0)[others]
        reached = job.time_to(args.target)
        rows.append(
            (
                job.wall,
                job.samples_per_second,
                job.per_rank(job.rank_samples, others),
                float(np.mean(job.seconds[others] / steps)) * 1e3 - args.compute_ms,
                float(np.mean(job.extra[others, EXTRA.index("cpu_seconds")] / steps)) * 1e3,
                np.nan if reached is None else reached,
            )
        )
    columns = list(zip(*rows, strict=True))
    reached = [t for t in columns[5] if not np.isnan(t)]
    return Cell(
        *(statistics.median(column) for column in columns[:5]),
        to_target=statistics.median(reached) if len(reached) == len(jobs) else float("nan"),
        reached=len(reached),
        accuracy=statistics.median(job.final_accuracy for job in jobs),
    )


@dataclass
class Row:
    spec: str
    asynchronous: bool
    alone: Cell
    straggling: Cell

    @property
    def label(self) -> str:
        if self.spec == DDP:
            return "DDP (gloo)"
        return "fast_torch, no communication" if self.spec == NONE else f"fast_torch `{self.spec}`"

    @property
    def mode(self) -> str:
        return "–" if self.spec == NONE else ("async" if self.asynchronous else "sync")


def build_strategy(spec: str) -> Strategy:
    """This benchmark's ``none`` (a strategy that does nothing) or any strategy string of fast_core."""
    return Strategy() if spec == NONE else fast_core.make_strategy(spec)


def is_asynchronous(spec: str) -> bool:
    return spec not in (DDP, NONE) and not build_strategy(spec).lockstep


def _time(cell: Cell, runs: int) -> str:
    return f"{cell.to_target:.2f}" if cell.reached == runs else f"not reached ({cell.reached}/{runs} runs)"


def table(rows: Sequence[Row], ddp: Row | None, runs: int) -> str:
    lines = [
        "| system | mode | job wall-clock s (alone / straggler) | job samples/s alone | vs DDP | job samples/s with "
        "straggler | vs DDP | s to target, consensus model (alone / straggler) | final accuracy, consensus model "
        "(alone / straggler) | per-rank samples/s (alone / straggler) | per-rank ms/step beyond the compute (alone) "
        "| CPU ms/step (alone) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, s = r.alone, r.straggling
        vs_a = f"{a.job_rate / ddp.alone.job_rate:.2f}" if ddp else "–"
        vs_s = f"{s.job_rate / ddp.straggling.job_rate:.2f}" if ddp else "–"
        lines.append(
            f"| {r.label} | {r.mode} | {a.wall:.2f} / {s.wall:.2f} | {a.job_rate:.0f} | {vs_a} | {s.job_rate:.0f} "
            f"| {vs_s} | {_time(a, runs)} / {_time(s, runs)} | {a.accuracy:.3f} / {s.accuracy:.3f} "
            f"| {a.rank_rate:.0f} / {s.rank_rate:.0f} | {a.extra_ms:.2f} | {a.cpu_ms:.2f} |"
        )
    return "\n".join(lines)


def reading(rows: Sequence[Row], args: argparse.Namespace) -> str:
    """One paragraph reading the measured numbers against the two goals, whatever they are."""
    ddp = next((r for r in rows if r.spec == DDP), None)
    if ddp is None:
        return "DDP was not run, so nothing is compared with it."
    text = []
    allreduce = next((r for r in rows if r.spec == "allreduce"), None)
    if allreduce is not None:
        ratio = allreduce.alone.job_rate / ddp.alone.job_rate
        met = "met" if ratio >= THROUGHPUT_GOAL else "missed"
        text.append(
            f"Goal 1, fast_torch's all-reduce within {1 - THROUGHPUT_GOAL:.0%} of DDP's job samples/s: {met}, "
            f"{allreduce.alone.job_rate:.0f} against {ddp.alone.job_rate:.0f} ({ratio:.2f}x) without a straggler, "
            f"{allreduce.straggling.job_rate / ddp.straggling.job_rate:.2f}x with one. Per step, beyond the "
            f"{args.compute_ms:g} ms of emulated compute, a rank spends {ddp.alone.extra_ms:.2f} ms under DDP and "
            f"{allreduce.alone.extra_ms:.2f} ms under fast_torch's all-reduce (the real forward and backward pass, "
            "the gradient all-reduce — gloo over TCP on loopback for DDP, MPI's shared memory for FAST — and each "
            "library's own overhead), so the ratio compares the transports as much as the libraries: PyTorch's pip "
            "wheels have no MPI backend to run DDP on the same transport. "
        )
    asyncs = [r for r in rows if r.asynchronous]
    if asyncs:
        ahead = [r for r in asyncs if r.straggling.job_rate > ddp.straggling.job_rate]
        verdict = "met" if len(ahead) == len(asyncs) else ("partly met" if ahead else "missed")
        parts = ", ".join(
            f"`{r.spec}` {r.straggling.job_rate:.0f} ({r.straggling.job_rate / ddp.straggling.job_rate:.2f}x, "
            f"job wall-clock {r.straggling.wall:.2f} s against DDP's {ddp.straggling.wall:.2f} s)"
            for r in asyncs
        )
        text.append(
            f"Goal 2, asynchronous strategies ahead of DDP with a straggler at the same budget: {verdict}: DDP's job "
            f"drops from {ddp.alone.job_rate:.0f} to {ddp.straggling.job_rate:.0f} samples/s "
            f"({ddp.straggling.job_rate / ddp.alone.job_rate:.2f}, every rank at the straggler's pace), {parts}. "
        )
        faster = [
            r
            for r in asyncs
            if r.straggling.reached == args.repeats
            and (ddp.straggling.reached < args.repeats or r.straggling.to_target < ddp.straggling.to_target)
        ]
        if faster:
            text.append(
                f"Time until the consensus model reaches {args.target:.0%} test accuracy with the straggler: "
                + ", ".join(f"`{r.spec}` {r.straggling.to_target:.2f} s" for r in faster)
                + f" against DDP's {_time(ddp.straggling, args.repeats)} s. "
            )
        else:
            text.append(
                f"No asynchronous strategy's consensus model reached {args.target:.0%} test accuracy sooner than "
                f"DDP with the straggler (DDP: {_time(ddp.straggling, args.repeats)}; "
                + ", ".join(f"`{r.spec}`: {_time(r.straggling, args.repeats)}" for r in asyncs)
                + "). "
            )
    syncs = [r for r in rows if not r.asynchronous and r.spec not in (DDP, NONE, "allreduce")]
    if syncs:
        text.append(
            "D-PSGD and SGP are synchronous (each step waits for its neighbours' messages), so with the straggler "
            "they slow down like DDP: "
            + ", ".join(f"`{r.spec}` {r.straggling.job_rate / r.alone.job_rate:.2f}" for r in syncs)
            + " of their straggler-free job samples/s. "
        )
    ceiling = next((r for r in rows if r.spec == NONE), None)
    if ceiling is not None:
        comm = [r for r in rows if r.spec in (DDP, "allreduce")]
        text.append(
            f"Without any communication (fast_torch's hooks around a strategy that does nothing) a rank spends "
            f"{ceiling.alone.extra_ms:.2f} ms per step beyond the sleep and {ceiling.alone.cpu_ms:.2f} CPU ms; "
            + ", ".join(
                f"{'DDP' if r.spec == DDP else 'fast_torch all-reduce'} adds "
                f"{r.alone.extra_ms - ceiling.alone.extra_ms:.2f} ms and {r.alone.cpu_ms - ceiling.alone.cpu_ms:.2f} "
                "CPU ms"
                for r in comm
            )
            + " for its gradient all-reduce. "
        )
    low = [r for r in rows if min(r.alone.accuracy, r.straggling.accuracy) < ddp.alone.accuracy - 0.03]
    if low:
        text.append(
            f"Consensus-model accuracy more than 0.03 below DDP's {ddp.alone.accuracy:.3f}: "
            + ", ".join(f"`{r.spec}` {r.alone.accuracy:.3f} / {r.straggling.accuracy:.3f}" for r in low)
            + ". "
        )
    else:
        text.append(f"Every consensus model ends within 0.03 of DDP's test accuracy ({ddp.alone.accuracy:.3f}). ")
    return "".join(text).strip()


def section(rows: Sequence[Row], args: argparse.Namespace, ranks: int, params: int, epoch_steps: int) -> str:
    """The Markdown section this benchmark owns, markers included."""
    library = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    ddp = next((r for r in rows if r.spec == DDP), None)
    return "\n".join(
        [
            START,
            "## fast_torch against DistributedDataParallel (`benchmarks/torch_vs_ddp.py`)",
            "",
            f"`{command_line(ranks)}`",
            "",
            f"{library}, PyTorch {torch.__version__} (CPU, 1 thread per rank), {ranks} ranks, {os.cpu_count()} CPUs, "
            f"{datetime.date.today()}; load average {args.load:.1f} when the run started (other jobs on the machine "
            "share its cores).",
            "",
            f"An MLP 64-{args.hidden}-{args.hidden}-10 ({params:,} float32 parameters, {params * 4 / 1e6:.1f} MB of "
            "gradient or parameters per message) on scikit-learn's digits, each rank on its own shard "
            f"({epoch_steps} steps a pass), batch {args.batch_size} per rank, SGD lr {args.lr} momentum "
            f"{args.momentum}, the same start and data order for every system. Every run trains the same shared "
            f"budget of {args.epochs:g} global epochs ({args.budget:,} samples summed over the ranks): fast_torch "
            "through `fast_core.Budget` (`worker.claim_batch` before each batch; under an asynchronous strategy a "
            "faster rank trains more of it and all stop together), DDP as a lockstep FAST strategy would, "
            "floor(budget / (batch x ranks)) steps on every rank. DDP is `DistributedDataParallel` on gloo (default "
            "buckets), started inside the same MPI job; fast_torch is `fast_torch.DistributedOptimizer` on the "
            f"same `torch.optim.SGD`. Each step sleeps {args.compute_ms:g} ms before its forward pass, to stand in "
            "for a larger model's compute (the real forward and backward pass take about 1.5 ms on an idle core, "
            "more with 4 ranks sharing the cores: the no-communication row shows what a step costs beyond the sleep "
            f"without any communication); with a straggler, rank {args.straggler_rank} sleeps {args.straggler:g}x "
            f"as long ({args.compute_ms * args.straggler:g} ms): the same {args.compute_ms * (args.straggler - 1):g} "
            "ms more per step under every system, outside DDP's backward. Job wall-clock: from the earliest rank's "
            "start (after the worker's start and a barrier) to the last rank's stop (its last step's end); job "
            "samples/s: all ranks' samples over that wall-clock; vs DDP divides by DDP's under the same "
            "condition. Every rank keeps a copy of its parameters every "
            f"{args.every_ms:g} ms from its start; after the run the copies of each point are averaged and rank 0 "
            "evaluates the average, so s to target is the first point at which the consensus model (the mean of "
            f"all ranks' parameters) reached {args.target:.0%} test accuracy, nothing evaluated during training. "
            "Final accuracy: the consensus model's after the run (`fast.average_model`; DDP's replicas are "
            "identical). Per-rank samples/s (each rank's samples over its own time), ms/step beyond the compute "
            "(wall time per step minus the sleep) and CPU ms/step (whole process, all threads) are means over the "
            f"ranks other than the straggler. Medians over {args.repeats} rounds that run every system in turn, "
            "without then with the straggler.",
            "",
            table(rows, ddp, args.repeats),
            "",
            reading(rows, args),
            END,
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        sys.exit("run with several ranks: mpiexec -n 4 python -m mpi4py benchmarks/torch_vs_ddp.py")
    args.straggler_rank = size - 1 if args.straggler_rank is None else args.straggler_rank
    args.load = os.getloadavg()[0]
    for spec in args.systems:  # fail on a typo now, not after minutes of running
        if spec != DDP:
            build_strategy(spec)
    torch.set_num_threads(1)
    init_gloo(comm)
    task = load_task(rank, size)
    args.budget = int(args.epochs * comm.allreduce(len(task.y_train)))  # global epochs: the samples of all shards
    runs: dict[tuple[str, float], list[Job]] = {}
    started = time.perf_counter()
    for round_ in range(args.repeats):
        for spec in args.systems:
            for slowdown in (1.0, args.straggler):
                run = run_once(comm, spec, task, args, slowdown)
                if run is not None:
                    runs.setdefault((spec, slowdown), []).append(run)
            if rank == 0:
                print(
                    f"round {round_ + 1}/{args.repeats}: {spec} done ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    dist.destroy_process_group()
    if rank != 0:
        return
    rows = [
        Row(
            spec,
            is_asynchronous(spec),
            summarize(runs[spec, 1.0], args),
            summarize(runs[spec, args.straggler], args),
        )
        for spec in args.systems
    ]
    params = sum(p.numel() for p in make_model(args.hidden).parameters())
    text = section(rows, args, size, params, len(task.y_train) // args.batch_size)
    print(text)
    if args.out:
        write_section(args.out, NAME, text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
