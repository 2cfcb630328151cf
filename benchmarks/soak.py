"""The chaos soak (``benchmarks/chaos.py --soak``): one long job of the torch example on 8 ranks under every fault
FAST survives, one fault a minute, against an undisturbed run of the same command.

Faults, in a shuffled rotation: ``kill`` (SIGKILL to a random rank's process), ``freeze`` (SIGSTOP: its guard kills
it after ``--freeze-timeout``), ``nan`` (SIGUSR1 under FAST_INJECT_FAULTS=1: its parameters turn NaN and it leaves at
its next own check) and ``join`` (``fast run --join RUN_DIR -n 1``: a late worker joins, while the group is below
``--max-ranks``). Lost ranks are replaced (``--max-restarts``). The job must finish its budget with exit 0, its
consensus model within 1 point of the undisturbed run's, no hang (``--job-timeout``), no process left behind, and
every fault named in run.json (a lost rank by its pid, how it ended; a joiner among "joined").

    python benchmarks/chaos.py --soak --strategies async:torus -n 8 --epochs 1500 --every 60 --minutes 30 \\
        --mpiexec PATH_TO_ULFM_MPIEXEC --out docs/reliability/soak.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos import EXAMPLE, alive, rank_pids

from fast_core.observers.runlog import read_run

FAULTS = ("kill", "freeze", "nan", "join")
SIGNALS = {"kill": signal.SIGKILL, "freeze": signal.SIGSTOP, "nan": signal.SIGUSR1}


@dataclass
class Struck:
    """One fault: when, what, whom (launch number and pid; a joiner's numbers once answered), and whether run.json
    names it."""

    at: float
    kind: str
    rank: int | None = None
    pid: int | None = None
    joined: list[int] = field(default_factory=list)
    named: bool = False
    how: str = ""


@dataclass
class SoakRun:
    disturbed: bool
    status: int = 0
    seconds: float = 0.0
    accuracy: float | None = None
    hang: bool = False
    orphans: int = 0
    faults: list[Struck] = field(default_factory=list)
    ranks_at_end: int = 0
    tail: str = ""


def command(args: argparse.Namespace, strategy: str, run_dir: Path) -> list[str]:
    line = [sys.executable, "-m", "fast_core.cli", "run", "-n", str(args.workers), "--strategy", strategy]
    line += ["--fault-tolerant", "--max-restarts", str(args.max_restarts), "--max-ranks", str(args.max_ranks)]
    line += ["--freeze-timeout", str(args.freeze_timeout), "--run-dir", str(run_dir), "--no-progress"]
    if args.mpiexec:
        line += ["--mpiexec", args.mpiexec]
    return line + ["-m", EXAMPLE, "--epochs", str(args.epochs)]


def soak_once(args: argparse.Namespace, strategy: str, disturbed: bool, rng: random.Random) -> SoakRun:
    run_dir = Path(tempfile.mkdtemp(prefix="fast-soak-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAST_TIMEOUT": str(args.timeout), "FAST_INJECT_FAULTS": "1"}
    began = time.time()
    output_file = run_dir / "soak-output.txt"  # a file, not a pipe: nobody reads a pipe while faults strike, and a
    # full one blocks fast run's relay and then the ranks' own writes (it hung the first soak after 14 faults)
    with output_file.open("w") as output:
        job = subprocess.Popen(command(args, strategy, run_dir), env=env, stdout=output, stderr=subprocess.STDOUT)
    run = SoakRun(disturbed)
    seen: set[int] = set()
    askers: list[tuple[Struck, subprocess.Popen]] = []
    if disturbed:
        _strike(args, run_dir, job, run, seen, askers, env, rng)
    try:
        job.wait(timeout=max(1.0, args.job_timeout - (time.time() - began)))
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
        run.hang = True
    run.seconds, run.status = time.time() - began, job.returncode
    run.tail = output_file.read_text(errors="replace")[-2000:]
    for struck, asker in askers:
        answer = asker.communicate(timeout=60)[0]
        struck.how = answer.strip().splitlines()[-1] if answer.strip() else ""
    seen |= set(rank_pids(run_dir).values())
    time.sleep(2.0)  # processes the launcher is still reaping
    run.orphans = sum(alive(pid) for pid in seen)
    _name_faults(run, run_dir)
    records = read_run(run_dir)
    results = [r for r in records.get(0, []) if r["kind"] == "result" and "test_accuracy" in r]
    run.accuracy = results[-1]["test_accuracy"] if results else None
    run.ranks_at_end = sum(1 for rs in records.values() if any(r["kind"] == "close" for r in rs))
    return run


def _strike(args, run_dir: Path, job, run: SoakRun, seen: set[int], askers: list, env: dict, rng) -> None:
    """Once every rank trains: a fault every ``args.every`` seconds for ``args.minutes``, while the job runs."""
    deadline = time.time() + 300
    while len(rank_pids(run_dir)) < args.workers and job.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    joins_left = args.max_ranks - args.workers
    rotation: list[str] = []
    end = time.time() + 60 * args.minutes
    while time.time() < end:
        waited = time.time() + args.every
        while time.time() < waited and job.poll() is None:
            time.sleep(0.2)
        if job.poll() is not None:
            return
        if not rotation:
            rotation = [f for f in FAULTS if f != "join" or joins_left > 0]
            rng.shuffle(rotation)
        kind = rotation.pop()
        if kind == "join":
            joins_left -= 1
            struck = Struck(time.time(), kind)
            asker = [sys.executable, "-m", "fast_core.cli", "run", "--join", str(run_dir), "-n", "1"]
            process = subprocess.Popen(asker, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            askers.append((struck, process))
            run.faults.append(struck)
            print(f"  {time.strftime('%H:%M:%S')} join: one worker asks to join", flush=True)
            continue
        pids = {r: p for r, p in rank_pids(run_dir).items() if alive(p) and _running(p)}
        seen |= set(pids.values())
        if not pids:
            continue
        rank = rng.choice(sorted(pids))
        os.kill(pids[rank], SIGNALS[kind])
        run.faults.append(Struck(time.time(), kind, rank, pids[rank]))
        print(f"  {time.strftime('%H:%M:%S')} {kind} rank {rank} (pid {pids[rank]})", flush=True)


def _running(pid: int) -> bool:
    """Not stopped already (a frozen rank its guard has not killed yet is not struck again)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "T"
    except OSError:
        return False


def _name_faults(run: SoakRun, run_dir: Path) -> None:
    """Whether run.json names each fault: the lost rank's pid among "lost_ranks", with how it ended; the joiner's
    launch number among "joined"."""
    try:
        described = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return
    lost = {e.get("pid"): e for e in described.get("lost_ranks", [])}
    joined = described.get("joined", [])
    for struck in run.faults:
        if struck.kind == "join":
            listed = struck.how.split("rank(s) [")[-1].split("]")[0] if "joined the job" in struck.how else ""
            struck.joined = [int(n) for n in listed.split(",") if n.strip().isdigit()]
            struck.named = bool(struck.joined) and all(n in joined for n in struck.joined)
            continue
        ending = lost.get(struck.pid)
        if ending is None:
            continue
        frozen, left = ending.get("frozen") is not None, ending.get("left")
        killed = ending.get("signal") == "SIGKILL" and not left and not frozen
        expected = {"kill": killed, "freeze": frozen, "nan": left}
        struck.named = bool(expected[struck.kind])
        struck.how = left or ("frozen" if frozen else str(ending.get("signal", "")))


def report(args: argparse.Namespace, strategy: str, calm: SoakRun, hit: SoakRun) -> str:
    """Markdown: the soak's verdict, then every fault with how run.json names it."""
    kinds = {k: sum(1 for f in hit.faults if f.kind == k) for k in FAULTS}
    accuracy = (
        f"{calm.accuracy:.3f} / {hit.accuracy:.3f}" if calm.accuracy is not None and hit.accuracy is not None else "n/a"
    )
    lines = [
        f"{EXAMPLE}, `{strategy}`, {args.workers} ranks, budget {args.epochs} global epochs, a fault every "
        f"{args.every:g} s for {args.minutes:g} min, `--max-restarts {args.max_restarts} --max-ranks {args.max_ranks} "
        f"--freeze-timeout {args.freeze_timeout:g}`, FAST_TIMEOUT={args.timeout:g}",
        "",
        "| run | exit | wall-clock s | consensus test accuracy | faults | ranks at the end | hang | orphans |",
        "|---|---|---|---|---|---|---|---|",
        f"| undisturbed | {calm.status} | {calm.seconds:.0f} | {calm.accuracy} | 0 | {calm.ranks_at_end} | "
        f"{calm.hang} | {calm.orphans} |",
        f"| soak | {hit.status} | {hit.seconds:.0f} | {hit.accuracy} | "
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
        + f" | {hit.ranks_at_end} | {hit.hang} | {hit.orphans} |",
        "",
        f"Accuracy undisturbed / soak: {accuracy}; faults named in run.json: "
        f"{sum(f.named for f in hit.faults)} of {len(hit.faults)}.",
        "",
        "| s since the first fault | fault | rank (pid) | named in run.json | as |",
        "|---|---|---|---|---|",
    ]
    first = hit.faults[0].at if hit.faults else 0.0
    for struck in hit.faults:
        whom = f"{struck.rank} ({struck.pid})" if struck.rank is not None else f"joined {struck.joined}"
        named = "yes" if struck.named else "NO"
        lines.append(f"| {struck.at - first:.0f} | {struck.kind} | {whom} | {named} | {struck.how} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    """``chaos.py --soak``: the undisturbed run, then the soak, of each strategy; the report to stdout and --out."""
    rng = random.Random(args.seed)
    reports = []
    for strategy in args.strategies.split(";") if ";" in args.strategies else [args.strategies]:
        if args.undisturbed_accuracy is None:
            calm = soak_once(args, strategy, disturbed=False, rng=rng)
        else:  # measured before with the same command (the report says so)
            calm = SoakRun(False, status=-1, accuracy=args.undisturbed_accuracy)
        print(f"undisturbed: exit {calm.status}, {calm.seconds:.0f} s, accuracy {calm.accuracy}", flush=True)
        hit = soak_once(args, strategy, disturbed=True, rng=rng)
        print(f"soak: exit {hit.status}, {hit.seconds:.0f} s, accuracy {hit.accuracy}", flush=True)
        if hit.status or calm.status:
            print(hit.tail, calm.tail, sep="\n", flush=True)
        reports.append(report(args, strategy, calm, hit))
    text = "\n\n".join(reports)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
