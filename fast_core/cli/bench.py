"""``fast bench --framework torch -n 4 --strategies allreduce,dpsgd,async,sgp [--straggler 3] [--compare-ddp]``.

Runs the framework's example once per strategy (one mpiexec launch each, one after the other, so they do not share
the cores), each into its own run folder under the bench folder, then writes there a table (results.md,
results.csv) and figures (loss.png, accuracy.png) computed from the ranks' records.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time
from pathlib import Path

from ..runlog import read_run
from .common import CLIError, check_strategy, new_run_dir, positive, say, slug, warn_if_oversubscribed
from .frameworks import FRAMEWORKS, Framework
from .launch import Job, find_mpiexec, python_target, run_job
from .plots import plot
from .run import add_launch_options, launch_variables, run_config, started, write_run_file
from .summary import Records, Row, compare, markdown, median, summarize, write_csv

DDP = "DDP"
DEFAULT_STRATEGIES = "allreduce,dpsgd,async,sgp"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="train the example with several strategies and compare them",
        description="Train a framework's example once per strategy, side by side, and write a table (markdown, "
        "CSV) and plots into the bench folder.",
        epilog="example: fast bench --framework torch -n 4 --strategies allreduce,async --straggler 3 --compare-ddp "
        "(arguments after -- go to the example)",
    )
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="numpy", help="whose example to run")
    parser.add_argument(
        "--strategies", default=DEFAULT_STRATEGIES, help=f"comma-separated (default {DEFAULT_STRATEGIES})"
    )
    parser.add_argument("--compare-ddp", action="store_true", help="also run torch DistributedDataParallel (gloo)")
    parser.add_argument("--epochs", type=positive, help="epochs per run (default: the example's)")
    parser.add_argument("--data", help="the example's task: digits or mnist1d (torch, tf, jax)")
    parser.add_argument("--target", type=float, default=0.9, help="validation accuracy for the time-to-target column")
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


def plan(framework: Framework, args: argparse.Namespace) -> list[tuple[str, str]]:
    """(label, mode) of each run, strategies checked now: a typo must not cost the runs before it."""
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not names:
        raise CLIError("--strategies is empty; give e.g. allreduce,dpsgd,async")
    runs = []
    for name in names:
        strategy = check_strategy(name, None, args.workers)
        runs.append((name, "sync" if strategy.lockstep else "async"))
    if args.compare_ddp:
        if not framework.ddp:
            raise CLIError(
                f"--compare-ddp runs torch DistributedDataParallel: use --framework torch, not {framework.name}"
            )
        runs.append((DDP, DDP))
    if len({slug(label) for label, _ in runs}) != len(runs):
        raise CLIError(f"--strategies {args.strategies}: a strategy is named twice")
    return runs


def describe(framework: Framework, args: argparse.Namespace, settings: list[str]) -> str:
    straggler = (
        f"rank {args.workers - 1 if args.straggler_rank is None else args.straggler_rank} {args.straggler:g}x slower "
        "(it sleeps (factor - 1) x its measured compute before each optimizer step)"
        if args.straggler
        else "no straggler"
    )
    return (
        f"`{shlex.join(['fast', *sys.argv[1:]])}`\n\n"
        f"{shlex.join([framework.module, *settings])}, {args.workers} workers on {os.cpu_count()} CPUs, {straggler}, "
        f"{datetime.date.today()}. Samples/s is the job's: the sum over ranks of each rank's samples over its own "
        "training time (from the worker's start to the end of its last step, evaluations included). Time to "
        f"target: the first epoch end at which rank 0's own replica reached {args.target:.0%} validation accuracy. "
        "Final accuracy: the "
        "example's test accuracy of the averaged model. kB sent/step and staleness: the FAST worker's counters, "
        "means over ranks (DDP's gloo traffic is not counted). One launch per row and round, one after the other"
        + (f"; medians over {args.repeats} rounds that run every row in turn." if args.repeats > 1 else ".")
    )


def main(args: argparse.Namespace) -> int:
    framework = FRAMEWORKS[args.framework]
    framework.check()
    settings = example_arguments(framework, args)
    runs = plan(framework, args)
    run_config(args, strategy=None, run_dir=Path("."), progress=False, label="")  # bad options: say so now
    find_mpiexec(args.mpiexec)  # missing: say so before the first run, not in it
    bench_dir = args.run_dir or new_run_dir(f"bench-{framework.name}")
    shown = sys.stdout.isatty()
    warn_if_oversubscribed(args.workers, args.hostfile)
    say(f"{len(runs)} runs x {args.repeats} of {framework.module} on {args.workers} workers; results in {bench_dir}")
    write_run_file(bench_dir, **started(args), framework=framework.name, runs=[label for label, _ in runs])
    records: dict[str, Records] = {}  # the first round's, for the figures
    measured: dict[str, list[Row]] = {label: [] for label, _ in runs}
    for round_ in range(1, args.repeats + 1):
        for index, (label, mode) in enumerate(runs, start=1):
            name = f"[{index}/{len(runs)}]" + (f" round {round_}/{args.repeats}" if args.repeats > 1 else "")
            run_dir = bench_dir / slug(label) / (f"round{round_}" if args.repeats > 1 else "")
            strategy = label if mode != DDP else None
            config = run_config(args, strategy=strategy, run_dir=run_dir, progress=shown, label=label)
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
    rows = [median(measured[label]) for label, _ in runs]
    baseline = compare(rows)
    for each_round in zip(*measured.values(), strict=True):
        compare(list(each_round))
    table = markdown(rows, baseline, args.target)
    straggling = f", one rank {args.straggler:g}x slower" if args.straggler else ""
    title = f"{framework.name}, {args.workers} workers{straggling}"
    text = f"# fast bench: {title}\n\n{describe(framework, args, settings)}\n\n{table}\n"
    (bench_dir / "results.md").write_text(text, encoding="utf-8")
    write_csv(rows, bench_dir / "results.csv")
    if args.repeats > 1:
        write_csv([row for label in measured for row in measured[label]], bench_dir / "rounds.csv")
    rounds = f" (curves: round 1; samples/s: medians of {args.repeats} rounds)" if args.repeats > 1 else ""
    figures = plot(records, rows, bench_dir, title + rounds)
    print(table)
    say(f"wrote {bench_dir / 'results.md'}, results.csv, {', '.join(p.name for p in figures)}")
    return 0


def _brief(row: Row) -> str:
    speed = "?" if row.samples_per_second is None else f"{row.samples_per_second:.0f}"
    accuracy = "?" if row.final_accuracy is None else f"{row.final_accuracy:.4f}"
    return f"{speed} samples/s, final test accuracy {accuracy}"


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) + "\n"
