"""Issue 15's time goal read from a `fast bench` folder: when did each strategy's consensus model reach all-reduce's
final accuracy (within 0.5 point), against all-reduce's wall-clock?

    python benchmarks/slow_links_goal.py slow_links/bench

For every run (strategy x round) of the bench: the job's wall-clock, the final test accuracy, and the first time
the consensus model's validation accuracy reached all-reduce's final validation accuracy (median over its rounds)
minus 0.5 point; medians over rounds, and that time as a fraction of all-reduce's job wall-clock.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fast_core.cli.summary import accuracy_curve, job_wall_clock, last
from fast_core.observers.runlog import read_run


def runs(bench: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for folder in sorted(bench.glob("*/round*")):
        ranks = read_run(folder)
        curve, _ = accuracy_curve(ranks)
        result = last(ranks.get(0, []), "result") or {}
        found.setdefault(folder.parent.name, []).append(
            {
                "job": job_wall_clock(ranks),
                "test": result.get("test_accuracy"),
                "curve": [(r["time"], r["val_accuracy"]) for r in curve],
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path)
    parser.add_argument("--baseline", default="allreduce")
    args = parser.parse_args()
    found = runs(args.bench)
    base = found[args.baseline]
    goal = statistics.median(run["curve"][-1][1] for run in base) - 0.005
    base_job = statistics.median(run["job"] for run in base)
    print(f"all-reduce: final validation accuracy {goal + 0.005:.4f} (median); goal: {goal:.4f} within 0.3 x "
          f"{base_job:.2f} s = {0.3 * base_job:.2f} s\n")
    print("| strategy | job s (median) | vs all-reduce | final test accuracy (rounds) | s to all-reduce's accuracy "
          "- 0.5 pt (rounds) | that time vs all-reduce's job |")
    print("|---|---:|---:|---|---|---:|")
    for label, rounds in found.items():
        reached = [next((t for t, a in run["curve"] if a >= goal), None) for run in rounds]
        times = [t for t in reached if t is not None]
        middle = statistics.median(times) if len(times) == len(reached) else None
        job = statistics.median(run["job"] for run in rounds)
        tests = ", ".join(f"{run['test']:.4f}" for run in rounds)
        cells = ", ".join("never" if t is None else f"{t:.2f}" for t in reached)
        share = "-" if middle is None else f"{middle / base_job:.2f}x"
        print(f"| `{label}` | {job:.2f} | {job / base_job:.2f}x | {tests} | {cells} | {share} |")


if __name__ == "__main__":
    main()
