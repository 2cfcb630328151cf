"""Jin et al. (2016), "How to scale distributed deep learning?", in miniature on `fast simulate`.

Their claim: asynchronous methods (elastic averaging, gossiping SGD) reach a target accuracy sooner up to about 32
workers; synchronous all-reduce scales better towards 100. Here: the same three families (``allreduce``,
``easgd:synchronous=false``, ``gossip:synchronous=false``) on 8 to 128 simulated workers, each with a batch of 16
per step (weak scaling, as theirs), the 9,610-parameter MLP on digits, time for the consensus model to reach the
target, under several link speeds and step-time spreads. Prints a table per scenario and writes
docs/reproductions/jin.csv and jin.png:

    OMP_NUM_THREADS=1 python benchmarks/jin_crossover.py            # about 10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from fast_core.simulate import ComputeTimes, LinkModel, Simulation, parse_rate, simulate

STRATEGIES = ("allreduce", "easgd:synchronous=false", "gossip:synchronous=false")
SCENARIOS = {  # name: links (bandwidth, latency) and compute (10 ms a step; "spread": lognormal sigma 0.5 per step)
    "1gbit": (LinkModel(parse_rate("1gbit"), 50e-6), ComputeTimes(0.01)),
    "1gbit-ring": (LinkModel(parse_rate("1gbit"), 50e-6, allreduce="ring"), ComputeTimes(0.01)),
    "1gbit-spread": (LinkModel(parse_rate("1gbit"), 50e-6), ComputeTimes(0.01, step_spread=0.5)),
    "100mbit": (LinkModel(parse_rate("100mbit"), 100e-6), ComputeTimes(0.01)),
    "10gbit": (LinkModel(parse_rate("10gbit"), 5e-6), ComputeTimes(0.01)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="8,16,32,64,128")
    parser.add_argument("--steps", type=int, default=150, help="steps per worker (the asynchronous ones share N x)")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated names of SCENARIOS")
    parser.add_argument("--out", type=Path, default=Path("docs/reproductions"))
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    rows = []
    for name in args.scenarios.split(","):
        links, compute = SCENARIOS[name]
        print(f"\n{name}: time (virtual s) for the consensus model to reach {args.target} (never: not in the budget)")
        print(f"{'N':>5} " + "".join(f"{s:>26}" for s in STRATEGIES) + "   fastest")
        for n in counts:
            times = {}
            for strategy in STRATEGIES:
                result = simulate(Simulation(strategy, n, args.steps, links=links, compute=compute))
                times[strategy] = result.time_to(args.target)
                rows.append(
                    [name, n, strategy, times[strategy], result.final_accuracy, result.finish, result.wall_seconds]
                )
            reached = {s: t for s, t in times.items() if t is not None}
            best = min(reached, key=reached.get) if reached else "none"
            cells = "".join(f"{'never' if t is None else f'{t:.3f}':>26}" for t in times.values())
            print(f"{n:>5} {cells}   {best}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "jin.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["scenario", "workers", "strategy", "time_to_target", "final_accuracy", "job_seconds", "wall"])
        writer.writerows(rows)
    plot(rows, counts, args.out / "jin.png", args.target)
    print(f"wrote {args.out / 'jin.csv'} and {args.out / 'jin.png'}")


def plot(rows: list[list], counts: list[int], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r[0] for r in rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 3.6), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for strategy in STRATEGIES:
            points = [(r[1], r[3]) for r in rows if r[0] == scenario and r[2] == strategy and r[3] is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=strategy)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_title(scenario, fontsize=9)
        ax.set_xlabel("workers")
        ax.set_ylabel(f"virtual s to {target:g}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
