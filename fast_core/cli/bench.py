"""``fast bench --framework torch -n 4 --strategies allreduce,dpsgd:ring,every=4 [--straggler 3] [--compare-ddp]``.

Runs the framework's example once per strategy (one mpiexec launch each, one after the other, so they do not share
the cores), each into its own run folder under the bench folder, then writes there a table (results.md,
results.csv) and figures (loss.png, accuracy.png) computed from the ranks' records.

A fair straggler: ``--straggler F`` first launches the example once with a strategy that exchanges nothing, for
one epoch (the calibration folder), reads the straggler rank's compute per step from its records, and gives every
run of the bench the same fixed sleep of ``(F - 1) x`` that compute per step (``FAST_STRAGGLER_SECONDS``), so DDP,
whose gradient all-reduce runs inside backward, loses no more time than FAST's strategies. ``--straggler-seconds
S`` gives that sleep directly.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from fast_core.cli.common import CLIError, check_strategy, new_run_dir, positive, say, slug, warn_if_oversubscribed
from fast_core.cli.frameworks import FRAMEWORKS, Framework
from fast_core.cli.launch import Job, find_mpiexec, python_target, run_job
from fast_core.cli.plots import plot
from fast_core.cli.run import add_launch_options, launch_config, launch_variables, started, write_run_file
from fast_core.cli.strategy_options import add_strategy_options, chosen_strategies
from fast_core.cli.summary import CONSENSUS, Records, Row, compare, markdown, median, summarize, write_csv
from fast_core.config.run import RunConfig
from fast_core.observers.runlog import read_run
from fast_core.observers.straggler import calibrated_seconds, compute_per_step
from fast_core.strategies.spec import StrategySpec

DDP = "DDP"
DEFAULT_STRATEGIES = ("allreduce", "dpsgd", "async", "sgp")
CALIBRATION_STRATEGY = "localsgd:period=1000000000"
"""A strategy that exchanges nothing while training (local SGD that never reaches its averaging step)."""
CALIBRATION_ARGUMENTS = ["--epochs", "1"]
"""What the calibration launch adds to the example's arguments (the last --epochs wins): one epoch."""
CALIBRATION_LOG_EVERY = 5


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="train the example with several strategies and compare them",
        description="Train a framework's example once per strategy, side by side, and write a table (markdown, "
        "CSV) and plots into the bench folder.",
        epilog="example: fast bench --framework torch -n 4 --strategies allreduce,dpsgd:ring,every=4 async "
        "--straggler 3 --compare-ddp (arguments after -- go to the example)",
    )
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="numpy", help="whose example to run")
    add_strategy_options(parser, DEFAULT_STRATEGIES)  # the runs follow the command line's order
    parser.add_argument("--compare-ddp", action="store_true", help="also run torch DistributedDataParallel (gloo)")
    parser.add_argument("--epochs", type=positive, help="epochs per run (default: the example's)")
    parser.add_argument("--data", help="the example's task: digits or mnist1d (torch, tf, jax)")
    parser.add_argument(
        "--target",
        type=float,
        default=0.9,
        help="validation accuracy of the consensus model for the time-to-target column",
    )
    parser.add_argument(
        "--repeats", type=positive, default=1, help="rounds, each running every strategy in turn; medians reported"
    )
    add_launch_options(parser)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: arguments for the example")
    parser.set_defaults(handler=main)


def example_arguments(framework: Framework, args: argparse.Namespace) -> list[str]:
    extra = args.extra[1:] if args.extra[:1] == ["--"] else list(args.extra)
    chosen = []
    if args.epochs:
        chosen += ["--epochs", str(args.epochs)]
    if args.data:
        if args.data not in framework.data:
            offered = f"one of: {', '.join(framework.data)}" if framework.data else "none (it has no --data)"
            raise CLIError(f"--data {args.data}: the {framework.name} example offers {offered}")
        chosen += ["--data", args.data]
    return chosen + extra


class Run(NamedTuple):
    """One row of the bench: its label (the strategy string as given), sync/async/DDP, and the parsed strategy."""

    label: str
    mode: str
    spec: StrategySpec | None


def plan(framework: Framework, args: argparse.Namespace) -> list[Run]:
    """The runs, strategies parsed and checked now: a typo must not cost the runs before it."""
    chosen = chosen_strategies(args, DEFAULT_STRATEGIES)
    runs = []
    for label, spec in chosen:
        strategy = check_strategy(spec, None, args.workers)
        runs.append(Run(label, "sync" if strategy.lockstep else "async", spec))
    if args.compare_ddp:
        if not framework.ddp:
            raise CLIError(
                f"--compare-ddp runs torch DistributedDataParallel: use --framework torch, not {framework.name}"
            )
        runs.append(Run(DDP, DDP, None))
    if len({slug(run.label) for run in runs}) != len(runs):
        raise CLIError(f"strategies {', '.join(label for label, _ in chosen)}: a strategy is named twice")
    return runs


def calibrate(
    framework: Framework, args: argparse.Namespace, settings: list[str], bench_dir: Path, echo: bool
) -> tuple[float, float]:
    """One launch of the example with no communication, for one epoch and without a budget: (compute seconds per
    step of the straggler rank, the fixed sleep per step that makes it ``--straggler`` times slower)."""
    run_dir = bench_dir / "calibration"
    spec = StrategySpec.parse(CALIBRATION_STRATEGY)
    config = replace(
        launch_config(args, strategy=spec, run_dir=run_dir, progress=False, label="calibration"),
        straggler=None,
        straggler_seconds=None,
        budget_samples=None,
        budget_seconds=None,
        log_every=CALIBRATION_LOG_EVERY,
    )
    target = python_target(None, framework.module, settings + CALIBRATION_ARGUMENTS)
    job = Job(target, args.workers, launch_variables(config), args.mpiexec, args.hostfile)
    say(f"calibrating the straggler: {CALIBRATION_STRATEGY} (no exchange), {' '.join(CALIBRATION_ARGUMENTS)}")
    status = run_job(job, args.grace, log=run_dir / "output.log", echo=echo)
    if status != 0:
        raise CLIError(f"the calibration launch failed with exit status {status} (output: {run_dir / 'output.log'})")
    rank = straggler_rank(args)
    compute = compute_per_step(read_run(run_dir).get(rank, []))
    if compute is None:
        raise CLIError(
            f"the calibration launch recorded no compute time for rank {rank} ({run_dir}): does the example take a "
            "step through the FAST worker? Give the sleep directly with --straggler-seconds S"
        )
    return compute, calibrated_seconds(args.straggler, compute)


def straggler_rank(args: argparse.Namespace) -> int:
    return args.workers - 1 if args.straggler_rank is None else args.straggler_rank


def describe(
    framework: Framework, args: argparse.Namespace, settings: list[str], calibration: tuple[float, float] | None
) -> str:
    rank = straggler_rank(args)
    if calibration is not None:
        compute, pause = calibration
        straggler = (
            f"Straggler: rank {rank} {args.straggler:g}x slower: a calibration launch ({CALIBRATION_STRATEGY}, "
            f"which exchanges nothing, {' '.join(CALIBRATION_ARGUMENTS)}) measured its compute at "
            f"{compute * 1e3:.3f} ms per step (from a step's end to its gradient hook), so in every run below it "
            "sleeps a fixed "
            f"({args.straggler:g} - 1) x {compute * 1e3:.3f} = {pause * 1e3:.3f} ms before each optimizer step, "
            "whatever the strategy."
        )
    elif args.straggler_seconds:
        straggler = (
            f"Straggler: rank {rank} sleeps a fixed {args.straggler_seconds * 1e3:.3f} ms before each optimizer step, "
            "whatever the strategy."
        )
    else:
        straggler = "No straggler."
    return (
        f"`{shlex.join(['fast', *sys.argv[1:]])}`\n\n"
        f"{shlex.join([framework.module, *settings])}, {args.workers} workers on {os.cpu_count()} CPUs, "
        f"{datetime.date.today()}. {straggler}\n\n"
        "Job wall-clock: seconds from the job's common start (the FAST worker's collective start, the earliest "
        "rank's) to the moment the last rank ended its last step. Job samples/s: the samples all ranks trained, "
        "summed, over that job wall-clock. vs: job samples/s over the baseline's. Per-rank samples/s (mean): the "
        "mean over ranks of each rank's samples over its own training time (its start to the end of its last step); "
        "not the job's throughput. Time to target: seconds from the common start to the first evaluation of the "
        f"consensus model (the average of all ranks' models, from the example's \"{CONSENSUS}\" records) at "
        f"{args.target:.0%} validation accuracy or more; a run without such records falls back to rank 0's own "
        "replica at its epoch ends, marked. Final test accuracy: the example's test accuracy of the averaged model "
        "after training (rank 0's \"result\" record). kB sent/step and staleness: the FAST worker's counters, means "
        "over ranks (DDP's gloo traffic is not counted). Times include the epochs' evaluations. One launch per row "
        "and round, one after the other"
        + (f"; medians over {args.repeats} rounds that run every row in turn." if args.repeats > 1 else ".")
    )


def main(args: argparse.Namespace) -> int:
    framework = FRAMEWORKS[args.framework]
    framework.check()
    settings = example_arguments(framework, args)
    runs = plan(framework, args)
    launch_config(args, strategy=None, run_dir=Path("."), progress=False, label="")  # bad options: say so now
    find_mpiexec(args.mpiexec)  # missing: say so before the first run, not in it
    bench_dir = args.run_dir or new_run_dir(f"bench-{framework.name}")
    shown = sys.stdout.isatty()
    warn_if_oversubscribed(args.workers, args.hostfile)
    say(f"{len(runs)} runs x {args.repeats} of {framework.module} on {args.workers} workers; results in {bench_dir}")
    write_run_file(bench_dir, **started(args), framework=framework.name, runs=[run.label for run in runs])
    calibration = None
    if args.straggler is not None and args.straggler > 1:
        calibration = calibrate(framework, args, settings, bench_dir, echo=args.verbose)
        compute, pause = calibration
        say(
            f"rank {straggler_rank(args)} computes {compute * 1e3:.3f} ms per step: it sleeps {pause * 1e3:.3f} ms "
            "per step in every run"
        )
        write_run_file(bench_dir, calibrated_compute_seconds=compute, straggler_seconds=pause)
    records: dict[str, Records] = {}  # the first round's, for the figures
    measured: dict[str, list[Row]] = {run.label: [] for run in runs}
    for round_ in range(1, args.repeats + 1):
        for index, (label, mode, spec) in enumerate(runs, start=1):
            name = f"[{index}/{len(runs)}]" + (f" round {round_}/{args.repeats}" if args.repeats > 1 else "")
            run_dir = bench_dir / slug(label) / (f"round{round_}" if args.repeats > 1 else "")
            config = launch_config(args, strategy=spec, run_dir=run_dir, progress=shown, label=label)
            if calibration is not None:
                config = fixed_straggler(config, calibration[1])
            variables = launch_variables(config)
            target = python_target(None, framework.module, settings + (["--ddp"] if mode == DDP else []))
            job = Job(target, args.workers, variables, args.mpiexec, args.hostfile)
            say(f"{name} {label}")
            began = time.monotonic()
            status = run_job(job, args.grace, log=run_dir / "output.log", echo=shown or args.verbose)
            if status != 0:
                if not (shown or args.verbose):
                    sys.stderr.write(_tail(run_dir / "output.log"))
                say(f"{label} failed with exit status {status} (output: {run_dir / 'output.log'}); stopping the bench")
                return status
            ranks = read_run(run_dir)
            records.setdefault(label, ranks)
            measured[label].append(summarize(label, mode, ranks, args.target))
            say(f"{name} {label}: {_brief(measured[label][-1])}, {time.monotonic() - began:.0f} s with start-up")
    rows = [median(measured[run.label]) for run in runs]
    baseline = compare(rows)
    for each_round in zip(*measured.values(), strict=True):
        compare(list(each_round))
    table = markdown(rows, baseline, args.target)
    straggling = f", one rank {args.straggler:g}x slower" if args.straggler else ""
    if args.straggler_seconds:
        straggling = f", one rank {args.straggler_seconds * 1e3:g} ms slower per step"
    title = f"{framework.name}, {args.workers} workers{straggling}"
    text = f"# fast bench: {title}\n\n{describe(framework, args, settings, calibration)}\n\n{table}\n"
    (bench_dir / "results.md").write_text(text, encoding="utf-8")
    write_csv(rows, bench_dir / "results.csv")
    if args.repeats > 1:
        write_csv([row for label in measured for row in measured[label]], bench_dir / "rounds.csv")
    rounds = f" (curves: round 1; job samples/s: medians of {args.repeats} rounds)" if args.repeats > 1 else ""
    figures = plot(records, rows, bench_dir, title + rounds)
    print(table)
    say(f"wrote {bench_dir / 'results.md'}, results.csv, {', '.join(p.name for p in figures)}")
    return 0


def fixed_straggler(config: RunConfig, seconds: float) -> RunConfig:
    """``config`` with the calibrated fixed straggler in place of the relative one (same rank)."""
    return replace(config, straggler=None, straggler_seconds=seconds)


def _brief(row: Row) -> str:
    wall = "?" if row.job_seconds is None else f"{row.job_seconds:.2f}"
    speed = "?" if row.job_samples_per_second is None else f"{row.job_samples_per_second:.0f}"
    accuracy = "?" if row.final_accuracy is None else f"{row.final_accuracy:.4f}"
    return f"job wall-clock {wall} s, {speed} job samples/s, final test accuracy {accuracy}"


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) + "\n"
