"""A job that grows: does a worker that joins mid-training shorten the job? Side by side, interleaved, medians.

Three launches of the same command per round, under Open MPI with ULFM (``fast run --max-ranks``):
- ``N``: ``-n N`` alone to the end of the shared budget;
- ``N + K joined``: ``-n N``, and ``fast run --join RUN_DIR -n K`` once rank 0 has trained ``--after`` seconds;
- ``N + K``: ``-n N+K`` from the start (what joining at once would give at best).
Figures per launch: the job's wall-clock (first rank's start to last rank's stop, from the records, as ``fast run``'s
"job:" line), the launcher's wall-clock, the consensus model's test accuracy, the step the workers joined at and
how long the group took to take them in (its "membership" record: starting the new processes, importing the
framework, the join's collectives).

    python benchmarks/grow.py --mpiexec PATH_TO_ULFM_MPIEXEC --workers 1 --join 1 --after 5 --epochs 40 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fast_core.cli.summary import summarize
from fast_core.observers.runlog import read_run


@dataclass
class Launch:
    label: str
    job_seconds: float
    launcher_seconds: float
    accuracy: float | None
    joined_step: int | None = None
    change_seconds: float | None = None
    status: int = 0


def _command(args: argparse.Namespace, workers: int, run_dir: Path) -> list[str]:
    most = args.workers + args.join  # the same engine for all: fault tolerant, may grow where there is room
    growth = ["--max-ranks", str(most)] if workers < most else ["--fault-tolerant"]
    line = [sys.executable, "-m", "fast_core.cli", "run", "-n", str(workers), *growth, "--log-every", "5"]
    line += ["--mpiexec", args.mpiexec, "--strategy", args.strategy, "--run-dir", str(run_dir), "--no-progress"]
    return line + ["-m", args.example, "--epochs", str(args.epochs)]


def _training_for(run_dir: Path, seconds: float, job: subprocess.Popen) -> None:
    """Until rank 0's records say it has trained ``seconds`` since its start (or the job ended)."""
    while job.poll() is None:
        steps = [r for r in read_run(run_dir).get(0, []) if r["kind"] == "step"]
        if steps and steps[-1].get("time", 0.0) >= seconds:
            return
        time.sleep(0.1)


def launch(args: argparse.Namespace, label: str, workers: int, join: int) -> Launch:
    run_dir = Path(tempfile.mkdtemp(prefix="fast-grow-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    job = subprocess.Popen(_command(args, workers, run_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if join:
        _training_for(run_dir, args.after, job)
        asker = [sys.executable, "-m", "fast_core.cli", "run", "--join", str(run_dir), "-n", str(join)]
        subprocess.run(asker, env=env, capture_output=True, timeout=300)
    output, _ = job.communicate(timeout=3600)
    launcher = time.monotonic() - began
    ranks = read_run(run_dir)
    row = summarize(label, "", ranks, target=1.0)
    results = [r for r in ranks.get(0, []) if r["kind"] == "result" and "test_accuracy" in r]
    joins = [r for r in ranks.get(0, []) if r["kind"] == "membership" and r.get("joined")]
    accuracy = results[-1]["test_accuracy"] if results else None
    outcome = Launch(label, row.job_seconds or float("nan"), launcher, accuracy)
    outcome.status = job.returncode
    if joins:
        outcome.joined_step, outcome.change_seconds = joins[0]["step"], joins[0]["recovery_seconds"]
    if job.returncode:
        print(output.decode()[-2000:], file=sys.stderr)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mpiexec", required=True, help="Open MPI's mpiexec built with ULFM")
    parser.add_argument("--workers", type=int, default=1, help="ranks launched")
    parser.add_argument("--join", type=int, default=1, help="workers that ask to join")
    parser.add_argument("--after", type=float, default=5.0, help="seconds rank 0 trains before they ask")
    parser.add_argument("--epochs", type=int, default=40, help="the job's budget in global epochs")
    parser.add_argument("--strategy", default="dpsgd:ring")
    parser.add_argument("--example", default="fast_examples.torch_mnist1d")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, k = args.workers, args.join
    plans = [(f"{n}", n, 0), (f"{n} + {k} joined after {args.after:g} s", n, k), (f"{n + k}", n + k, 0)]
    launches: dict[str, list[Launch]] = {label: [] for label, _, _ in plans}
    for round_ in range(args.repeats):
        for label, workers, join in plans:  # interleaved: each round runs every plan once
            outcome = launch(args, label, workers, join)
            launches[label].append(outcome)
            print(f"round {round_ + 1}: {label}: job {outcome.job_seconds:.1f} s, exit {outcome.status}", flush=True)
    print(f"\n{args.example}, {args.strategy}, budget {args.epochs} global epochs, medians of {args.repeats} rounds")
    print("| ranks | job wall-clock s | launcher wall-clock s | test accuracy | joined at step | group change s |")
    print("|---|---|---|---|---|---|")
    for label, outcomes in launches.items():
        accuracy = [o.accuracy for o in outcomes if o.accuracy is not None]
        steps = [o.joined_step for o in outcomes if o.joined_step is not None]
        changes = [o.change_seconds for o in outcomes if o.change_seconds is not None]
        print(
            f"| {label} | {statistics.median(o.job_seconds for o in outcomes):.1f} "
            f"| {statistics.median(o.launcher_seconds for o in outcomes):.1f} "
            f"| {statistics.median(accuracy) if accuracy else float('nan'):.3f} "
            f"| {statistics.median(steps) if steps else '-'} "
            f"| {f'{statistics.median(changes):.1f}' if changes else '-'} |"
        )
    rounds = (f"{label}: " + ", ".join(f"{o.job_seconds:.1f}" for o in runs) for label, runs in launches.items())
    print("\njob wall-clock s of every round: " + "; ".join(rounds))


if __name__ == "__main__":
    main()
