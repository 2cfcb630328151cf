"""``fast simulate -n 8,32,128 --strategy allreduce --strategy dpsgd:ring``: strategies on virtual clusters.

Each (workers, strategy) pair is one simulated job (fast_core.simulate): real strategy code and a real NumPy model on
virtual time, links and compute speeds as given. Prints one row per job: the job's virtual time, the consensus
model's final accuracy and time to ``--target``, bytes per worker per step, and how long the simulation took; writes
the table as CSV and the accuracy curves as a PNG when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

from fast_core.cli.common import CLIError, positive, say
from fast_core.cli.strategy_options import add_strategy_options, chosen_strategies
from fast_core.errors import ConfigError
from fast_core.simulate import ComputeTimes, LinkModel, Simulation, SimulationResult, parse_rate, simulate

DEFAULT_STRATEGIES = ("allreduce", "dpsgd:ring", "async:ring", "easgd:synchronous=false", "gossip:synchronous=false")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run strategies on N virtual workers (8 to hundreds) on virtual time",
        description="Simulate jobs of N workers in one process on virtual time: FAST's strategy code and a real "
        "NumPy model (digits, a 9,610-parameter MLP), messages timed by a link model (latency, bandwidth, queues at "
        "each link), compute times from a speed distribution. Deterministic for a seed.",
    )
    parser.add_argument("-n", "--np", dest="workers", default="8,32", help="comma-separated worker counts (8,32,128)")
    add_strategy_options(parser, DEFAULT_STRATEGIES)
    parser.add_argument("--steps", type=positive, default=200, help="steps per worker (async: N x steps shared)")
    parser.add_argument("--batch-size", type=positive, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--model", choices=("mlp", "softmax"), default="mlp")
    parser.add_argument("--bandwidth", default="1gbit", help="each worker's link, each way (tc style: 100mbit, 1gbit)")
    parser.add_argument("--latency", type=float, default=50e-6, help="one-way latency per message, seconds")
    parser.add_argument("--allreduce", choices=("halving", "ring"), default="halving", help="all-reduce algorithm")
    parser.add_argument("--switch", help="bandwidth of a switch all messages share (default: non-blocking)")
    parser.add_argument("--compute", type=float, default=0.01, help="seconds of compute per step (the median worker)")
    parser.add_argument("--machine-spread", type=float, default=0.0, help="lognormal sigma of machine speeds")
    parser.add_argument("--step-spread", type=float, default=0.0, help="lognormal sigma of each step's time")
    parser.add_argument("--heavy-tail", type=float, help="Pareto index of step times instead (e.g. 1.5)")
    parser.add_argument(
        "--straggler", action="append", default=[], metavar="RANK:FACTOR", help="a rank FACTOR times slower"
    )
    parser.add_argument("--target", type=float, default=0.9, help="accuracy for the time-to-target column")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="folder for simulate.csv and simulate.png")
    parser.set_defaults(handler=main)


@dataclass
class Row:
    workers: int
    strategy: str
    job_seconds: float
    final_accuracy: float
    time_to_target: float | None
    bytes_per_step: float
    consensus_distance: float
    wall_seconds: float


def row(result: SimulationResult, target: float) -> Row:
    setup = result.setup
    return Row(
        setup.workers,
        setup.strategy,
        result.finish,
        result.final_accuracy,
        result.time_to(target),
        result.bytes_per_worker_step,
        result.curve[-1].consensus_distance,
        result.wall_seconds,
    )


def table(rows: list[Row], target: float) -> str:
    lines = [
        f"{'N':>5}  {'strategy':<28} {'job s':>8} {'accuracy':>8} {f'to {target:g}':>8} {'kB/step':>8} "
        f"{'distance':>9} {'wall s':>7}"
    ]
    for r in rows:
        to = "never" if r.time_to_target is None else f"{r.time_to_target:.3f}"
        lines.append(
            f"{r.workers:>5}  {r.strategy:<28} {r.job_seconds:>8.3f} {r.final_accuracy:>8.3f} {to:>8} "
            f"{r.bytes_per_step / 1e3:>8.1f} {r.consensus_distance:>9.2e} {r.wall_seconds:>7.1f}"
        )
    return "\n".join(lines)


def _stragglers(items: list[str]) -> dict[int, float]:
    found = {}
    for item in items:
        rank, _, factor = item.partition(":")
        try:
            found[int(rank)] = float(factor)
        except ValueError:
            raise CLIError(f"--straggler {item!r}: write RANK:FACTOR, e.g. 3:2.5") from None
    return found


def setups(args: argparse.Namespace) -> list[Simulation]:
    try:
        counts = [int(n) for n in str(args.workers).split(",")]
    except ValueError:
        raise CLIError(f"-n {args.workers!r}: write worker counts separated by commas, e.g. 8,32,128") from None
    if any(n < 1 for n in counts):
        raise CLIError(f"-n {args.workers!r}: every worker count must be >= 1")
    switch = None if args.switch is None else parse_rate(args.switch)
    links = LinkModel(parse_rate(args.bandwidth), args.latency, switch, allreduce=args.allreduce)
    chosen = chosen_strategies(args, DEFAULT_STRATEGIES)  # every string checked before the first job
    jobs = []
    for n in counts:
        compute = ComputeTimes(
            args.compute, args.machine_spread, args.step_spread, args.heavy_tail, _stragglers(args.straggler), args.seed
        )
        for strategy, _ in chosen:
            jobs.append(
                Simulation(
                    strategy, n, args.steps, args.batch_size, args.lr, args.model, links, compute, seed=args.seed
                )
            )
    return jobs


def main(args: argparse.Namespace) -> int:
    jobs = setups(args)
    results = []
    for job in jobs:
        try:
            results.append(simulate(job))
        except ConfigError as exc:
            raise CLIError(f"{job.strategy} on {job.workers} workers: {exc}") from None
        say(table([row(results[-1], args.target)], args.target).splitlines()[-1])
    rows = [row(result, args.target) for result in results]
    print(table(rows, args.target))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, args.out / "simulate.csv")
        plot_curves(results, args.out / "simulate.png")
        say(f"wrote {args.out / 'simulate.csv'} and {args.out / 'simulate.png'}")
    return 0


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(Row.__dataclass_fields__))
        for r in rows:
            writer.writerow(list(vars(r).values()))


def plot_curves(results: list[SimulationResult], path: Path) -> None:
    """Consensus accuracy against virtual time, one panel per worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r.setup.workers for r in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(4.5 * len(counts), 3.6), squeeze=False)
    for ax, n in zip(axes[0], counts, strict=True):
        for result in (r for r in results if r.setup.workers == n):
            ax.plot([p.time for p in result.curve], [p.accuracy for p in result.curve], label=result.setup.strategy)
        ax.set_title(f"{n} workers")
        ax.set_xlabel("virtual seconds")
        ax.set_ylabel("consensus accuracy")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
