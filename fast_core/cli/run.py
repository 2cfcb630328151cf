"""``fast run -n 4 [--strategy S] [--topology T] script.py [args]``: N workers on this machine, no mpiexec flags.

The launcher builds one run configuration (``fast_core.config.run.RunConfig``: strategy, topology, straggler, run
folder, progress, work budget) and writes it into the ranks' environment; each rank's Worker reads it back, so the
script needs no arguments of its own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from fast_core.cli import plots
from fast_core.cli.common import (
    CLIError,
    DefaultCount,
    check_strategy,
    new_run_dir,
    positive,
    say,
    warn_if_oversubscribed,
    whole,
)
from fast_core.cli.dashboard import Background
from fast_core.cli.dashboard.server import DEFAULT_PORT
from fast_core.cli.endings import clear_endings, error_text, job_ending, joined_ranks, rank_text, with_step
from fast_core.cli.job_bar import JobBar
from fast_core.cli.join import join_job
from fast_core.cli.launch import EXITS, Job, python_target, run_job
from fast_core.cli.profile import profile_lines
from fast_core.cli.slurm import LAUNCHERS, slurm_arguments, slurm_ending
from fast_core.cli.summary import summarize
from fast_core.config.current import run_config
from fast_core.config.run import DEFAULT_STRATEGY, MAX_RESTARTS_VARIABLE, RunConfig, rank_prefix
from fast_core.observers.runlog import RUN_FILE, read_run, run_sizes
from fast_core.observers.tensorboard import check_folder
from fast_core.runtime.uncaught import cause_of, read_errors
from fast_core.strategies.spec import StrategySpec


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """Options `fast run` and `fast bench` share: ranks, straggler, cluster, output."""
    parser.add_argument(
        "-n",
        "--np",
        dest="workers",
        type=positive,
        default=DefaultCount(os.cpu_count() or 1),
        help="number of workers (MPI ranks); default: the number of CPUs (under --slurm: the tasks allocated)",
    )
    straggler = parser.add_mutually_exclusive_group()
    straggler.add_argument(
        "--straggler",
        type=float,
        metavar="FACTOR",
        help="make one rank FACTOR times slower: it sleeps (FACTOR-1) x its measured compute before each step "
        "(fast bench: (FACTOR-1) x the compute per step it calibrates first, the same seconds in every run)",
    )
    straggler.add_argument(
        "--straggler-seconds",
        type=float,
        metavar="S",
        help="make one rank slower by a fixed S seconds per step, whatever the strategy (FAST_STRAGGLER_SECONDS)",
    )
    parser.add_argument("--straggler-rank", type=int, metavar="R", help="which rank straggles (default: the last)")
    parser.add_argument("--run-dir", type=Path, help="where records go (default: runs/<date>-<time>-<name>)")
    parser.add_argument("--log-every", type=positive, default=10, metavar="K", help="a step record every K steps")
    parser.add_argument("--verbose", action="store_true", help="every rank prints its records as lines")
    parser.add_argument("--hostfile", help="run on the hosts listed there (passed to mpiexec)")
    parser.add_argument("--mpiexec", metavar="PATH", help="this mpiexec instead of the one next to python or on PATH")
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="after Ctrl-C, how long the workers get to stop before they are killed",
    )


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a script on N workers",
        description="Run a training script on N workers of this machine (or of a hostfile's), under mpiexec.",
        epilog="example: fast run -n 4 --strategy dpsgd:ring train.py --epochs 3",
    )
    add_launch_options(parser)
    parser.add_argument(
        "--strategy",
        metavar="SPEC",
        help="one strategy string, e.g. allreduce, dpsgd:ring,every=4, async:torus; parsed here once, the ranks get "
        "its canonical text (FAST_STRATEGY)",
    )
    parser.add_argument("--topology", help="topology of a strategy that names none, e.g. ring, torus (FAST_TOPOLOGY)")
    parser.add_argument(
        "--budget-samples",
        type=positive,
        metavar="N",
        help="a shared work budget: N samples summed over all ranks, then every rank stops; a faster rank does more "
        "of them under an asynchronous strategy (the script asks worker.claim_batch; FAST_BUDGET_SAMPLES)",
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        metavar="S",
        help="a shared work budget: S wall-clock seconds from the common start (FAST_BUDGET_SECONDS)",
    )
    parser.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="survive a lost rank: Open MPI built with ULFM under mpiexec --with-ft ulfm (pip install "
        "'fast-training[mpi-ft]'), and the fault-tolerant MPI engine in the ranks (FAST_FAULT_TOLERANT=1)",
    )
    parser.add_argument(
        "--max-restarts",
        type=whole,
        default=0,
        metavar="K",
        help="with --fault-tolerant (implied): start a new process for each of the first K ranks lost; it takes "
        "the survivors' model, step and optimizer state and the lost rank's place (FAST_MAX_RESTARTS)",
    )
    parser.add_argument(
        "--max-ranks",
        type=whole,
        default=0,
        metavar="M",
        help="with --fault-tolerant (implied): the job may grow to M ranks; `fast run --join RUN_DIR -n K` then asks "
        "it for K more, which it starts and takes in mid-training (FAST_MAX_RANKS; docs/reliability.md)",
    )
    parser.add_argument(
        "--join",
        type=Path,
        metavar="RUN_DIR",
        help="instead of launching: ask the job running in RUN_DIR (started with --max-ranks) to take -n more workers "
        "in; waits for its answer (FAST_TIMEOUT seconds at most) and says which ranks joined",
    )
    parser.add_argument(
        "--tensorboard",
        type=Path,
        metavar="DIR",
        help="every rank writes its records as TensorBoard scalars there too, while the job runs (DIR/rank<r>, the "
        "job's in DIR/job); needs pip install 'fast-training[tensorboard]' (FAST_TENSORBOARD)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="each rank splits its time by phase (compute, exchange, update, measurement, budget; on a core, waiting "
        "for one, blocked) and the CPU of its other threads; a table of it after the job (FAST_PROFILE)",
    )
    progress = parser.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always show the job's bar (samples of all ranks, rate, ETA); default: when stderr is a terminal",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false", help="never show a bar")
    parser.add_argument(
        "--no-rank-prefix",
        dest="rank_prefix",
        action="store_false",
        default=None,
        help="show the ranks' lines as they are, without [r] in front (FAST_RANK_PREFIX=0)",
    )
    parser.add_argument(
        "--freeze-timeout",
        type=float,
        default=None,
        metavar="S",
        help="a rank without a heartbeat for S seconds (stopped, or hung holding the interpreter) is killed by its "
        "guard: under --fault-tolerant the others then go on without it; 0: never (default: half of FAST_TIMEOUT "
        "under --fault-tolerant, else never)",
    )
    parser.add_argument(
        "--rank-bars",
        choices=("rank0", "all", "none"),
        default=None,
        help="whose own progress bars (Keras', tqdm's: lines redrawn with \\r) are drawn: default rank0 on a terminal "
        "without the job's bar, else none (their last draw, a whole line, is always shown)",
    )
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="inside a SLURM allocation (sbatch, salloc): run on its nodes and the tasks it allocated (docs/slurm.md)",
    )
    parser.add_argument(
        "--slurm-launcher",
        choices=LAUNCHERS,
        help="under --slurm: mpiexec (default; its daemons started by srun) or srun --mpi=pmi2|pmix (docs/slurm.md)",
    )
    parser.add_argument(
        "--dashboard", action="store_true", help=f"serve the job's page while it runs, on 127.0.0.1:{DEFAULT_PORT}"
    )
    parser.add_argument("--dashboard-at", metavar="[HOST:]PORT", help="serve it there instead (implies --dashboard)")
    parser.add_argument("-m", dest="module", action="store_true", help="the target is a module, as in python -m")
    parser.add_argument("target", metavar="script.py | module", nargs="?", help="what each worker runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    parser.set_defaults(handler=main)


def launch_config(
    args: argparse.Namespace, *, strategy: StrategySpec | None, run_dir: Path, progress: bool, label: str
) -> RunConfig:
    """The configuration every rank of one launch gets: this environment's (FAST_TIMEOUT, ...) plus the options;
    the strategy as its canonical text (None: the script's own)."""
    fixed = args.straggler_seconds
    if args.straggler is None and fixed is None and args.straggler_rank is not None:
        raise CLIError("--straggler-rank needs --straggler FACTOR (how many times slower) or --straggler-seconds S")
    if args.straggler is not None and not 1 <= args.straggler < math.inf:
        raise CLIError(f"--straggler {args.straggler:g}: the factor is how many times slower, >= 1 (e.g. 3)")
    if fixed is not None and not 0 <= fixed < math.inf:
        raise CLIError(f"--straggler-seconds {fixed:g}: give the seconds slept per step, >= 0 (e.g. 0.01)")
    rank = None
    if args.straggler is not None or fixed is not None:
        rank = args.workers - 1 if args.straggler_rank is None else args.straggler_rank
        if not 0 <= rank < args.workers:
            raise CLIError(f"--straggler-rank {rank} is not a rank of {args.workers} workers (0..{args.workers - 1})")
    seconds = getattr(args, "budget_seconds", None)
    if seconds is not None and not 0 < seconds < math.inf:
        raise CLIError(f"--budget-seconds {seconds:g}: give the wall-clock seconds to train, > 0 (e.g. 60)")
    outer = run_config()
    samples = getattr(args, "budget_samples", None)
    return replace(
        outer,
        budget_samples=outer.budget_samples if samples is None else samples,
        budget_seconds=outer.budget_seconds if seconds is None else seconds,
        strategy=None if strategy is None else str(strategy),
        topology=getattr(args, "topology", None) or outer.topology,
        straggler=args.straggler,
        straggler_rank=rank,
        straggler_seconds=fixed,
        run_dir=run_dir.resolve(),
        tensorboard=tensorboard_folder(args),
        log_every=args.log_every,
        profile=bool(getattr(args, "profile", False)) or outer.profile,
        progress=progress,
        verbose=args.verbose,
        label=label,
        fault_tolerant=bool(
            getattr(args, "fault_tolerant", False) or getattr(args, "max_restarts", 0) or getattr(args, "max_ranks", 0)
        ),
        max_restarts=getattr(args, "max_restarts", 0) or 0,
        max_ranks=_max_ranks(args),
    )


def _max_ranks(args: argparse.Namespace) -> int:
    """``--max-ranks``, checked against the workers launched: a job can only grow from its start."""
    most = getattr(args, "max_ranks", 0) or 0
    if most and most <= args.workers:
        raise CLIError(
            f"--max-ranks {most} is not above the {args.workers} workers launched: give the most ranks the job may "
            f"grow to, e.g. --max-ranks {2 * args.workers}"
        )
    return most


def tensorboard_folder(args: argparse.Namespace) -> Path | None:
    """Where ``--tensorboard`` asks the ranks to write, checked here once (created, writable, the writer installed)
    so that a bad one is one line before any rank starts."""
    named = getattr(args, "tensorboard", None)
    return None if named is None else check_folder(named.resolve())


def launch_variables(config: RunConfig) -> dict[str, str]:
    """The environment a launch adds: the whole configuration (so nothing leaks in from ours), and the terminal's
    width for the progress bar (a rank's stdout is a pipe)."""
    variables = config.to_environment()
    if config.progress:
        variables["COLUMNS"] = str(shutil.get_terminal_size().columns)
    return variables


def write_run_file(run_dir: Path, **fields: object) -> None:
    """Create or update run.json, the launcher's description of the job."""
    path = run_dir / RUN_FILE
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(fields)
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def started(args: argparse.Namespace) -> dict[str, object]:
    """What run.json says of every launch: the command line, the workers, the straggler, the start time."""
    return {
        "command": sys.argv,
        "workers": args.workers,
        "straggler": args.straggler,
        "straggler_seconds": args.straggler_seconds,
        "started": time.time(),
    }


def main(args: argparse.Namespace) -> int:
    if args.join is not None:
        return join_job(args.join, args.workers, run_config().timeout)
    if args.module and not args.target:
        raise CLIError("-m needs a module name, e.g. fast run -n 4 -m fast_examples.numpy_digits")
    target = python_target(None if args.module else args.target, args.target if args.module else None, args.args)
    named = args.strategy or run_config().strategy  # None: the script's own (all-reduce unless it names one)
    spec = StrategySpec.parse(named or DEFAULT_STRATEGY)  # the launcher's one parse; the ranks get str(spec)
    strategy = spec if named else None
    label = named or "default"
    run_dir = args.run_dir or new_run_dir(label)
    launcher: tuple[str, ...] = ()
    if args.slurm or args.slurm_launcher:  # the allocation's nodes and tasks; srun or mpiexec (fast_core/cli/slurm.py)
        args.workers, launcher, args.hostfile = slurm_arguments(args, run_dir)
    check_strategy(spec, args.topology, args.workers)
    bar = sys.stderr.isatty() if args.progress is None else args.progress
    config = launch_config(args, strategy=strategy, run_dir=run_dir, progress=False, label=label)  # the bar is ours
    exits = run_dir / EXITS
    clear_endings(run_dir)
    job = Job(
        target,
        args.workers,
        launch_variables(config),
        args.mpiexec,
        args.hostfile,
        exits=exits,
        fault_tolerant=config.fault_tolerant,
        spawns=config.max_restarts > 0 or config.max_ranks > 0,
        rank_prefix=rank_prefix() if args.rank_prefix is None else args.rank_prefix,
        redraws=args.rank_bars or ("rank0" if sys.stdout.isatty() and not bar else "none"),
        start_marks=run_dir if config.fault_tolerant else None,
        freeze_seconds=freeze_seconds(args.freeze_timeout, config),
        launcher=launcher,
    )
    warn_if_oversubscribed(args.workers, args.hostfile)
    chosen = f"strategy {label}" if label != "default" else "the script's strategy (allreduce unless it names one)"
    straggling = straggler_text(config)
    tolerant = ", fault-tolerant (Open MPI with ULFM)" if config.fault_tolerant else ""
    say(f"{args.workers} workers, {chosen}{straggling}{_budget_text(config)}{tolerant}")
    say(f"run folder: {run_dir}")
    if config.tensorboard is not None:
        say(f"TensorBoard: tensorboard --logdir {config.tensorboard}")
    write_run_file(
        run_dir,
        **started(args),
        strategy=args.strategy,
        topology=args.topology,
        target=target[3:],
        budget_samples=config.budget_samples,
        budget_seconds=config.budget_seconds,
        fault_tolerant=config.fault_tolerant,
        max_ranks=config.max_ranks,
        exit_status=None,  # a reused run folder's last ending is not this job's (fast run --join reads it)
        tensorboard=None if config.tensorboard is None else str(config.tensorboard),
    )
    began = time.monotonic()
    before = run_sizes(run_dir)  # a reused run folder: what the ranks write now comes after
    shown = JobBar(run_dir, args.workers, label, before) if bar else None
    relaunched: list[dict] = []  # ranks lost before MPI started, each followed by a new launch
    board = Background(run_dir, args.dashboard_at or str(DEFAULT_PORT)) if args.dashboard or args.dashboard_at else None
    try:
        status = run_job(job, grace=args.grace, show=shown.show if shown else None)
        while job.unstartable is not None and job.variables != (relaunch := launch_again(job, config, run_dir)):
            relaunched.append(job.unstartable)
            job = replace(job, variables=relaunch)  # the restarts left, one fewer
            status = run_job(job, grace=args.grace, show=shown.show if shown else None)
    finally:
        if shown is not None:
            shown.close()
        if board is not None:
            board.stop()
    status, ending, lines = job_ending(status, job, run_dir)
    if status != 0 and (errors := read_errors(run_dir)):  # what the ranks raised: the cause first, named once
        cause = cause_of(errors)
        ending["error"] = {k: cause.get(k) for k in ("rank", "error", "consequence", "peers")}
        lines = [error_text(cause, errors), *lines]
    if relaunched:
        ending["relaunched_after"] = relaunched
    if config.max_ranks and (joined := joined_ranks(run_dir)):
        ending["joined"] = joined
        lines.append(f"rank(s) {joined} joined the job while it ran (fast run --join)")
    if args.slurm:  # a node SLURM took from the job while it ran is named
        status = slurm_ending(status, run_dir, before, ending, lines)
    write_run_file(run_dir, exit_status=status, seconds=round(time.monotonic() - began, 3), **ending)
    for line in lines:
        say(line)
    for line in job_figures(run_dir, label, before, args.workers if config.profile else 0):
        say(line)
    if status != 0:
        say(f"the job ended with exit status {status}; records so far in {run_dir}")
    else:
        say(f"run folder: {run_dir}")
    return status


def freeze_seconds(given: float | None, config: RunConfig) -> float:
    """The bound a rank may go without a heartbeat before its guard kills it: ``--freeze-timeout``, else under
    ``--fault-tolerant`` half of FAST_TIMEOUT (the others' waits must outlast it, or they time out first), else
    never (a frozen rank's peers then end the job with a PeerTimeout naming it)."""
    if given is not None:
        if not 0 <= given < math.inf:
            raise CLIError(f"--freeze-timeout {given:g}: give the seconds without a heartbeat, >= 0 (0: never)")
        if given and config.timeout <= given:
            raise CLIError(
                f"--freeze-timeout {given:g} is not below FAST_TIMEOUT ({config.timeout:g} s): the other ranks would "
                "stop waiting for a frozen rank before its guard kills it; give fewer seconds (or raise FAST_TIMEOUT)"
            )
        return given
    return config.timeout / 2 if config.fault_tolerant and math.isfinite(config.timeout) else 0.0


def launch_again(job: Job, config: RunConfig, run_dir: Path) -> dict[str, str]:
    """After a launch stopped because a rank was lost before MPI started (``job.unstartable``): the variables of a
    new launch with one restart fewer, said, when ``--max-restarts`` has one left (nothing was trained: a new
    launch of every rank is the lost one's replacement); else the launch's own variables, unchanged."""
    left = int(job.variables.get(MAX_RESTARTS_VARIABLE, config.max_restarts))
    if left <= 0:
        return job.variables
    say(f"{rank_text(with_step(job.unstartable, run_dir))} before its MPI start: the job starts again ({left - 1} "
        "restart(s) left)")
    clear_endings(run_dir)
    return {**job.variables, MAX_RESTARTS_VARIABLE: str(left - 1)}


def job_figures(run_dir: Path, label: str, before: dict[int, int], profiled: int = 0) -> list[str]:
    """The job's rate (all ranks' samples over the job wall-clock, as ``fast bench`` counts it) and curves.png in
    the run folder, from the ranks' records of this launch (after ``before``, each rank file's bytes at the start),
    and under ``--profile`` (``profiled``: the job's workers) where each rank's time went; what could not be made
    is said, never in the job's way."""
    ranks = read_run(run_dir, before)
    if not ranks:
        return []
    row = summarize(label, "", ranks, target=1.0)
    lines = []
    if row.job_samples_per_second is not None and not row.job_samples and row.job_seconds is not None:
        lines.append(
            f"job: {row.job_seconds:.2f} s wall-clock from the first rank's start to the last rank's stop (the "
            "script recorded no samples: worker.claim_batch(n) or worker.records.step(samples=n) would count them)"
        )
    elif row.job_samples_per_second is not None:
        lines.append(
            f"job: {row.job_samples:.0f} samples in {row.job_seconds:.2f} s wall-clock, "
            f"{row.job_samples_per_second:.1f} samples/s (all ranks)"
        )
    try:
        lines.append(f"loss and accuracy against time: {plots.curves(ranks, run_dir, label)}")
    except (ImportError, OSError, ValueError) as exc:
        lines.append(f"no curves.png: {exc}")
    if profiled:
        lines.extend(profile_lines(ranks, profiled))
    return lines


def straggler_text(config: RunConfig) -> str:
    """The simulated straggler, as the launch line says it ("" without one)."""
    if config.straggler_seconds:
        return f", rank {config.straggler_rank} sleeps {config.straggler_seconds:g} s per step"
    if config.straggler and config.straggler != 1:
        return f", rank {config.straggler_rank} {config.straggler:g}x slower"
    return ""


def _budget_text(config: RunConfig) -> str:
    """The shared work budget, as the launch line says it ("" without one)."""
    parts = []
    if config.budget_samples is not None:
        parts.append(f"{config.budget_samples} samples")
    if config.budget_seconds is not None:
        parts.append(f"{config.budget_seconds:g} s")
    return f", budget {' or '.join(parts)} for the job" if parts else ""
