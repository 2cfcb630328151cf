"""Chaos runs: real faults against real jobs of the torch example under `fast run`, side by side with undisturbed
runs of the same command (interleaved, medians of repeats), and the table of docs/reliability.md.

Faults (``--fault``):
- ``kill``: SIGKILL a random live rank every ``--every`` seconds, ``--kills`` times, under ``--fault-tolerant``
  (Open MPI with ULFM; ``--max-restarts`` replaces the ranks lost). The job must finish its budget: figures are its
  exit status, wall-clock, test accuracy of the consensus model against the undisturbed run's, the time from each
  kill to the first survivor's detection (its "membership" record) and to the recovery, and processes left behind.
- ``kill-mpich``: SIGKILL one rank under the default MPI (MPICH, no fault tolerance): the job must end, naming the
  lost rank; the figure is the time from the kill to `fast run`'s exit.
- ``freeze``: SIGSTOP one rank (a process frozen is not dead to MPI): the job must end after FAST_TIMEOUT naming
  the frozen rank, with no process left.
- ``--soak``: one long fault-tolerant job under a fault a minute, of every kind (kill, freeze, NaN, a late joiner),
  against an undisturbed run (benchmarks/soak.py).

    python benchmarks/chaos.py --fault kill --strategies async:torus,adpsgd:ring,allreduce -n 8 --every 30 \\
        --kills 3 --max-restarts 3 --epochs 400 --mpiexec PATH_TO_OPEN_MPI_MPIEXEC
    python benchmarks/chaos.py --fault kill-mpich --strategies allreduce,async:ring -n 4

A kill hits the rank's own process (the one that wrote the rank's last "start" record), never rank 0 with
``--spare-rank-0`` (e.g. to keep its console output).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fast_core.grammar import split_specs
from fast_core.observers.runlog import read_run

EXAMPLE = "fast_examples.torch_mnist1d"


@dataclass
class Outcome:
    """One run of the example, disturbed or not."""

    strategy: str
    fault: str
    status: int
    seconds: float
    accuracy: float | None
    kills: list[tuple[float, int]] = field(default_factory=list)  # (time.time(), launch number)
    detections: list[float] = field(default_factory=list)  # seconds from each kill to its first detection
    recoveries: list[float] = field(default_factory=list)  # seconds from detection to training again
    replaced: int = 0
    orphans: int = 0
    ended_after: float | None = None  # seconds from the first kill to fast run's exit
    named: bool = False  # fast run's output names the rank struck (kill-mpich, freeze)
    tail: str = ""


def rank_pids(run_dir: Path) -> dict[int, int]:
    """Launch number -> pid of the process that wrote that rank's last "start" record."""
    pids = {}
    for rank, records in read_run(run_dir).items():
        starts = [r for r in records if r["kind"] == "start"]
        if starts and any(r["kind"] == "step" for r in records):
            pids[rank] = int(starts[-1]["pid"])
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def command(args: argparse.Namespace, strategy: str, run_dir: Path, fault: str) -> list[str]:
    line = [sys.executable, "-m", "fast_core.cli", "run", "-n", str(args.workers), "--strategy", strategy]
    line += ["--run-dir", str(run_dir), "--no-progress"]
    if fault == "kill" or (fault == "none" and args.fault == "kill"):  # the undisturbed run under the same MPI
        line += ["--fault-tolerant", "--max-restarts", str(args.max_restarts)]
        if args.mpiexec:
            line += ["--mpiexec", args.mpiexec]
    return line + ["-m", EXAMPLE, "--epochs", str(args.epochs)]


def run_once(args: argparse.Namespace, strategy: str, fault: str, rng: random.Random) -> Outcome:
    run_dir = Path(tempfile.mkdtemp(prefix="fast-chaos-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FAST_TIMEOUT": str(args.timeout)}
    began = time.time()
    output_file = run_dir / "chaos-output.txt"  # a file: a pipe nobody reads while faults strike fills and blocks
    with output_file.open("w") as written:
        line = command(args, strategy, run_dir, fault)
        process = subprocess.Popen(line, env=env, stdout=written, stderr=subprocess.STDOUT)
    outcome = Outcome(strategy, fault, 0, 0.0, None)
    seen: set[int] = set()
    if fault != "none":
        _disturb(args, fault, run_dir, process, outcome, seen, rng)
    try:
        process.wait(timeout=args.job_timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        outcome.tail = "TIMED OUT (hang)\n"
    output = output_file.read_text(errors="replace")
    ended = time.time()
    outcome.status = process.returncode
    outcome.tail += output[-1500:]
    outcome.named = all(f"rank {victim} " in output or f"rank(s) [{victim}]" in output for _, victim in outcome.kills)
    outcome.seconds = ended - began
    if outcome.kills:
        outcome.ended_after = ended - outcome.kills[0][0]
    records = read_run(run_dir)
    seen |= set(rank_pids(run_dir).values())
    time.sleep(1.0)  # a process the launcher is still reaping
    outcome.orphans = sum(alive(pid) for pid in seen)
    results = [r for r in records.get(0, []) if r["kind"] == "result" and "test_accuracy" in r]
    outcome.accuracy = results[-1]["test_accuracy"] if results else None
    memberships = sorted(
        (r for rs in records.values() for r in rs if r["kind"] == "membership"), key=lambda r: r["detected_at"]
    )
    for killed_at, victim in outcome.kills:
        mine = [r for r in memberships if str(victim) in r["lost"].split(",") and r["detected_at"] >= killed_at - 1]
        if mine:
            outcome.detections.append(mine[0]["detected_at"] - killed_at)
            outcome.recoveries.append(
                max(r["recovery_seconds"] for r in mine if r["detected_at"] < mine[0]["detected_at"] + 1)
            )
    outcome.replaced = len({r["replaced"] for r in memberships if r["replaced"]})
    return outcome


def _disturb(args, fault: str, run_dir: Path, process, outcome: Outcome, seen: set[int], rng: random.Random) -> None:
    """Wait for every rank to train, then strike as ``fault`` says while the job runs."""
    deadline = time.time() + 120
    while len(rank_pids(run_dir)) < args.workers and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    kills = args.kills if fault == "kill" else 1
    for _ in range(kills):
        waited = time.time() + (args.every if fault == "kill" else args.first)
        while time.time() < waited and process.poll() is None:
            time.sleep(0.1)
        if process.poll() is not None:
            return
        pids = {r: p for r, p in rank_pids(run_dir).items() if alive(p) and not (args.spare_rank_0 and r == 0)}
        seen |= set(pids.values())
        if not pids:
            return
        victim = rng.choice(sorted(pids))
        os.kill(pids[victim], signal.SIGSTOP if fault == "freeze" else signal.SIGKILL)
        outcome.kills.append((time.time(), victim))
    if fault == "freeze":  # let the job end on its own (a PeerTimeout naming the frozen rank), then release it
        waited = time.time() + args.timeout + 60
        while time.time() < waited and process.poll() is None:
            time.sleep(0.1)
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fault", choices=("kill", "kill-mpich", "freeze"), default="kill")
    parser.add_argument("--strategies", default="async:ring,adpsgd:ring,allreduce")
    parser.add_argument("-n", "--workers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=60, help="global epochs of the example (its budget)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between kills (fault kill)")
    parser.add_argument("--first", type=float, default=5.0, help="seconds of training before the fault (others)")
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0, help="FAST_TIMEOUT of the runs (seconds)")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="a run longer than this is a hang")
    parser.add_argument("--mpiexec", help="Open MPI's mpiexec built with ULFM (fault kill)")
    parser.add_argument("--spare-rank-0", action="store_true", help="never strike rank 0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write every outcome here")
    soak = parser.add_argument_group("the soak (benchmarks/soak.py): kill, freeze, NaN and late joiners on one job")
    soak.add_argument("--soak", action="store_true", help="run the soak instead of --fault")
    soak.add_argument("--minutes", type=float, default=30.0, help="how long faults strike (a fault every --every s)")
    soak.add_argument("--max-ranks", type=int, default=12, help="the group may grow to this many by late joiners")
    soak.add_argument("--freeze-timeout", type=float, default=10.0, help="a frozen rank's guard kills it after this")
    soak.add_argument("--out", type=Path, help="also write the soak's report here (markdown)")
    soak.add_argument(
        "--undisturbed-accuracy",
        type=float,
        help="skip the undisturbed run: its consensus test accuracy, measured before with the same command",
    )
    args = parser.parse_args()
    if args.soak:
        import soak

        soak.main(args)
        return
    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []
    for repeat in range(args.repeats):
        for strategy in split_specs(args.strategies):
            for fault in ("none", args.fault) if args.fault == "kill" else (args.fault,):
                outcome = run_once(args, strategy, fault, rng)
                outcomes.append(outcome)
                print(
                    f"[{repeat}] {strategy} {fault}: exit {outcome.status}, {outcome.seconds:.1f} s, accuracy "
                    f"{outcome.accuracy}, kills {[v for _, v in outcome.kills]}, detect {outcome.detections}, "
                    f"recover {outcome.recoveries}, orphans {outcome.orphans}",
                    flush=True,
                )
                if outcome.status != 0 and fault in ("none", "kill"):
                    print(outcome.tail, flush=True)
    print()
    print(table(args, outcomes))
    if args.json:
        args.json.write_text(json.dumps([vars(o) for o in outcomes], indent=1))


def table(args: argparse.Namespace, outcomes: list[Outcome]) -> str:
    """Markdown: one line per strategy, medians over repeats."""
    lines = []
    if args.fault == "kill":
        lines.append(
            "| strategy | kills | exit (disturbed) | wall-clock s undisturbed / disturbed | test accuracy "
            "undisturbed / disturbed | detect s (max) | recover s (max) | replaced | orphans |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
    else:
        lines.append("| strategy | fault | exit | struck rank named | fault to exit s (median) | orphans |")
        lines.append("|---|---|---|---|---|---|")
    for strategy in split_specs(args.strategies):
        mine = [o for o in outcomes if o.strategy == strategy]
        hit = [o for o in mine if o.fault != "none"]
        calm = [o for o in mine if o.fault == "none"]
        exits = sorted({o.status for o in hit})
        if args.fault == "kill":
            detect = [d for o in hit for d in o.detections]
            recover = [r for o in hit for r in o.recoveries]
            lines.append(
                f"| {strategy} | {median([len(o.kills) for o in hit])} | {exits} | "
                f"{median([o.seconds for o in calm])} / {median([o.seconds for o in hit])} | "
                f"{median([o.accuracy or 0 for o in calm])} / {median([o.accuracy or 0 for o in hit])} | "
                f"{max(detect) if detect else 'n/a':.3} | {max(recover) if recover else 'n/a':.3} | "
                f"{sum(o.replaced for o in hit)} | {sum(o.orphans for o in hit)} |"
            )
        else:
            ends = [o.ended_after for o in hit if o.ended_after is not None]
            named = "yes" if all(o.named for o in hit) else "no"
            orphans = sum(o.orphans for o in hit)
            lines.append(f"| {strategy} | {args.fault} | {exits} | {named} | {median(ends)} | {orphans} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
