"""fast_torch against PyTorch DistributedDataParallel: the same model, data and steps, in one MPI job.

Every rank trains the same MLP (float32, a few hundred thousand parameters) on its own shard of scikit-learn's
digits, once with ``torch.nn.parallel.DistributedDataParallel`` on the gloo backend and once per fast_core strategy
through ``fast_torch.DistributedOptimizer``, each without and with one straggler. Both systems live in the same
``mpiexec`` job: torch.distributed is initialised from mpi4py's rank and size (MASTER_ADDR 127.0.0.1, a free port
chosen by rank 0 and broadcast with MPI), so the runs interleave — DDP, the FAST strategies, DDP again, ... — and
machine noise hits both alike. The real computation per step is about a millisecond, so each step first sleeps
``--compute-ms`` to stand in for a larger model's forward and backward pass (a sleep leaves the CPU free, which
keeps 4 ranks on 2 cores fair); the straggler sleeps ``--straggler`` times as long.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py benchmarks/torch_vs_ddp.py --out docs/benchmarks.md
    ... benchmarks/torch_vs_ddp.py --system ddp --system allreduce --steps 100 --repeats 1

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from report import command_line, gather_to_root, markers, write_section
from torch.nn.parallel import DistributedDataParallel

import fast_core
import fast_torch as fast
from fast_core.datasets import batches, digits, shard_indices, train_test_split
from fast_core.strategies import Strategy

NAME = "torch_vs_ddp"
START, END = markers(NAME)
DDP = "ddp"
NONE = "none"
"""fast_torch's hooks around a strategy that communicates nothing: the ceiling, each rank training alone."""
DEFAULT_SYSTEMS = [DDP, "allreduce", "dpsgd:ring", "async:torus", "sgp:exp1", NONE]
THROUGHPUT_GOAL = 0.9
"""fast_torch's all-reduce should run at least this fraction of DDP's samples/s."""


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
    parser.add_argument("--steps", type=int, default=120, help="training steps per rank and run")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="emulated compute per step (a sleep)")
    parser.add_argument("--straggler", type=float, default=3.0, help="how many times slower the straggler is")
    parser.add_argument("--straggler-rank", type=int, help="which rank straggles (default: the last)")
    parser.add_argument("--hidden", type=int, default=512, help="width of the MLP's two hidden layers")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy for the time-to-target column")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between a rank's test evaluations")
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


@dataclass
class RankRun:
    """What one rank measured in one run."""

    seconds: float  # its own time for its steps, from the common start
    cpu_seconds: float  # CPU time of the whole process (trainer, gloo or communication threads) meanwhile
    to_target: float  # seconds from the start to the first evaluation of its own model at >= target; NaN: never


@dataclass
class Run:
    """One system, one condition: every rank's measurements and the averaged model's test accuracy."""

    ranks: list[RankRun]
    accuracy: float


def train(
    model: torch.nn.Module,
    step_model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    task: Task,
    args: argparse.Namespace,
    sleep_s: float,
    rank: int,
) -> tuple[float, float, float]:
    """``steps`` steps of sleep (the emulated compute), forward, backward, optimizer step; every ``eval_every``
    steps the rank's own model is evaluated on the test set (included in the time: well under a ms). Returns wall
    seconds, CPU seconds and the seconds to the target accuracy (NaN if never reached)."""
    stream = batch_stream(task, args.batch_size, seed=rank)
    loss_fn = torch.nn.CrossEntropyLoss()
    to_target = float("nan")
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(args.steps):
        x, y = next(stream)
        time.sleep(sleep_s)
        opt.zero_grad()
        loss_fn(step_model(x), y).backward()
        opt.step()
        if np.isnan(to_target) and (step + 1) % args.eval_every == 0 and accuracy(model, task) >= args.target:
            to_target = time.perf_counter() - start
    return time.perf_counter() - start, time.process_time() - cpu, to_target


def run_once(comm: MPI.Comm, spec: str, task: Task, args: argparse.Namespace, slowdown: float) -> Run | None:
    """Train a fresh model with ``spec``, the straggler computing ``slowdown`` times longer; rank 0 gets the Run."""
    rank = comm.Get_rank()
    model = make_model(args.hidden)
    sleep_s = args.compute_ms / 1e3 * (slowdown if rank == args.straggler_rank else 1.0)
    if spec == DDP:
        ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
        comm.Barrier()
        seconds, cpu_seconds, to_target = train(model, ddp, opt, task, args, sleep_s, rank)
        del ddp  # the replicas are identical: no averaging needed
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        strategy = build_strategy(spec)
        opt = fast.DistributedOptimizer(opt, model, strategy, engine=fast_core.mpi_engine(comm))  # broadcasts too
        comm.Barrier()
        seconds, cpu_seconds, to_target = train(model, model, opt, task, args, sleep_s, rank)
        fast.average_model(model)  # closes the worker (collective), then the mean of every rank's parameters
    final = accuracy(model, task)
    # numbers travel as a float64 array (never a pickle); NaN stands for "target never reached"
    table = gather_to_root(comm, [seconds, cpu_seconds, to_target])
    comm.Barrier()
    if rank != 0:
        return None
    return Run([RankRun(*map(float, r)) for r in table], final)


# summary ------------------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One system under one condition, medians over the repeats."""

    job_rate: float  # samples/s of the whole job: the sum over ranks of each rank's own samples/s
    rank_rate: float  # samples/s of one rank other than the straggler (mean over them)
    extra_ms: float  # ms per step beyond the emulated compute, mean of the ranks other than the straggler
    cpu_ms: float  # CPU ms per step of the whole process, mean of the ranks other than the straggler
    to_target: float  # s until every rank's own model reached the target (max over ranks); NaN: not in every run
    reached: int  # in how many runs every rank reached the target
    accuracy: float


def summarize(runs: Sequence[Run], args: argparse.Namespace, slowdown: float) -> Cell:
    steps, batch, straggler = args.steps, args.batch_size, args.straggler_rank
    rows = []
    for run in runs:
        others = [r for i, r in enumerate(run.ranks) if i != straggler]
        rows.append(
            (
                sum(steps * batch / r.seconds for r in run.ranks),
                statistics.fmean(steps * batch / r.seconds for r in others),
                statistics.fmean(r.seconds / steps * 1e3 for r in others) - args.compute_ms,
                statistics.fmean(r.cpu_seconds / steps * 1e3 for r in others),
                max(r.to_target for r in run.ranks),  # NaN if any rank never got there
            )
        )
    columns = list(zip(*rows, strict=True))
    reached = [t for t in columns[4] if not np.isnan(t)]
    return Cell(
        job_rate=statistics.median(columns[0]),
        rank_rate=statistics.median(columns[1]),
        extra_ms=statistics.median(columns[2]),
        cpu_ms=statistics.median(columns[3]),
        to_target=statistics.median(reached) if len(reached) == len(runs) else float("nan"),
        reached=len(reached),
        accuracy=statistics.median(run.accuracy for run in runs),
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
        "| system | mode | samples/s alone | vs DDP | samples/s with straggler | vs DDP | fast rank's samples/s "
        "(alone / straggler) | ms/step beyond the compute (alone) | CPU ms/step (alone) | s to target "
        "(alone / straggler) | accuracy (alone / straggler) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        a, s = r.alone, r.straggling
        vs_a = f"{a.job_rate / ddp.alone.job_rate:.2f}" if ddp else "–"
        vs_s = f"{s.job_rate / ddp.straggling.job_rate:.2f}" if ddp else "–"
        lines.append(
            f"| {r.label} | {r.mode} | {a.job_rate:.0f} | {vs_a} | {s.job_rate:.0f} | {vs_s} "
            f"| {a.rank_rate:.0f} / {s.rank_rate:.0f} | {a.extra_ms:.2f} | {a.cpu_ms:.2f} "
            f"| {_time(a, runs)} / {_time(s, runs)} | {a.accuracy:.3f} / {s.accuracy:.3f} |"
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
            f"Goal 1, fast_torch's all-reduce within {1 - THROUGHPUT_GOAL:.0%} of DDP's throughput: {met}, "
            f"{allreduce.alone.job_rate:.0f} against {ddp.alone.job_rate:.0f} samples/s ({ratio:.2f}x) without a "
            f"straggler, {allreduce.straggling.job_rate / ddp.straggling.job_rate:.2f}x with one. Per step, beyond "
            f"the {args.compute_ms:g} ms of emulated compute, DDP spends {ddp.alone.extra_ms:.2f} ms and fast_torch's "
            f"all-reduce {allreduce.alone.extra_ms:.2f} ms (the real forward and backward pass, the gradient "
            "all-reduce — gloo over TCP on loopback for DDP, MPI's shared memory for FAST — and each library's own "
            "overhead), so the ratio compares the transports as much as the libraries: PyTorch's pip wheels have no "
            "MPI backend to run DDP on the same transport. "
        )
    asyncs = [r for r in rows if r.asynchronous]
    if asyncs:
        ahead = [r for r in asyncs if r.straggling.job_rate > ddp.straggling.job_rate]
        verdict = "met" if len(ahead) == len(asyncs) else ("partly met" if ahead else "missed")
        parts = ", ".join(
            f"`{r.spec}` {r.straggling.job_rate:.0f} samples/s ({r.straggling.job_rate / ddp.straggling.job_rate:.2f}x"
            f", its fast ranks {r.straggling.rank_rate:.0f} each against {r.alone.rank_rate:.0f} alone)"
            for r in asyncs
        )
        text.append(
            f"Goal 2, asynchronous strategies ahead of DDP with a straggler: {verdict}: DDP drops from "
            f"{ddp.alone.job_rate:.0f} to {ddp.straggling.job_rate:.0f} samples/s "
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
                "Time until every rank's own model reaches "
                f"{args.target:.0%} test accuracy with the straggler: "
                + ", ".join(f"`{r.spec}` {r.straggling.to_target:.2f} s" for r in faster)
                + f" against DDP's {_time(ddp.straggling, args.repeats)} s. "
            )
        else:
            text.append(
                f"No asynchronous strategy got every rank to {args.target:.0%} test accuracy sooner than DDP with "
                f"the straggler (DDP: {_time(ddp.straggling, args.repeats)}; "
                + ", ".join(f"`{r.spec}`: {_time(r.straggling, args.repeats)}" for r in asyncs)
                + "). "
            )
    syncs = [r for r in rows if not r.asynchronous and r.spec not in (DDP, NONE, "allreduce")]
    if syncs:
        text.append(
            "D-PSGD and SGP are synchronous (each step waits for its neighbours' messages), so with the straggler "
            "they slow down like DDP: "
            + ", ".join(f"`{r.spec}` {r.straggling.job_rate / r.alone.job_rate:.2f}" for r in syncs)
            + " of their straggler-free samples/s. "
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
            f"Averaged-model accuracy more than 0.03 below DDP's {ddp.alone.accuracy:.3f}: "
            + ", ".join(f"`{r.spec}` {r.alone.accuracy:.3f} / {r.straggling.accuracy:.3f}" for r in low)
            + ". "
        )
    else:
        text.append(f"Every averaged model ends within 0.03 of DDP's test accuracy ({ddp.alone.accuracy:.3f}). ")
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
            f"({epoch_steps} steps an epoch), batch {args.batch_size} per rank, SGD lr {args.lr} momentum "
            f"{args.momentum}, {args.steps} steps per rank and run, the same start, data order and steps for every "
            "system. DDP is `DistributedDataParallel` on gloo (default buckets), started inside the same MPI job; "
            "fast_torch is `fast_torch.DistributedOptimizer` on the same `torch.optim.SGD`. Each step sleeps "
            f"{args.compute_ms:g} ms before its forward pass, to stand in for a larger model's compute (the real "
            "forward and backward pass take about 1.5 ms on an idle core, more with 4 ranks sharing the cores: the "
            "no-communication row shows what a step costs beyond the sleep without any communication); with a "
            "straggler, rank "
            f"{args.straggler_rank} sleeps {args.straggler:g}x as long ({args.compute_ms * args.straggler:g} ms). "
            f"Every rank times its own {args.steps} steps from a common barrier. Samples/s is the job's: the sum "
            "over ranks of each rank's samples over its own time (in asynchronous runs the fast ranks finish "
            "before the straggler); vs DDP divides by DDP's under the same condition; the fast rank's samples/s, "
            "ms/step beyond the compute (wall time per step minus the sleep) and CPU ms/step (whole process, all "
            "threads) are means over the ranks other than the straggler. Every rank evaluates its own model on the "
            f"test set every {args.eval_every} steps (included in the time); s to target is the time from the start "
            f"until every rank's own model has reached {args.target:.0%} test accuracy. Accuracy is the test "
            "accuracy of the mean of all ranks' parameters after the run (`fast.average_model`; DDP's replicas are "
            f"identical). Medians over {args.repeats} rounds that run every system in turn, without then with the "
            "straggler.",
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
    runs: dict[tuple[str, float], list[Run]] = {}
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
            summarize(runs[spec, 1.0], args, 1.0),
            summarize(runs[spec, args.straggler], args, args.straggler),
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
