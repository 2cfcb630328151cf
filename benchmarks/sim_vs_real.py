"""Does `fast simulate` follow a real run? The same jobs simulated and run for real, side by side.

Real: the job's workers as threads of this process (LocalCluster), each step's compute slept for the time the
compute model draws, so both runs ask for the same compute; its messages are in-process copies, so the simulated
links are made as fast (5 GB/s, 5 us). Three real repeats per job, interleaved with the simulation; compared: the
job's time (the last worker's end) and the consensus model's accuracy at ten common times (tenths of the real
job's median time), against the spread of the real repeats at those times.

    OMP_NUM_THREADS=1 python benchmarks/sim_vs_real.py      # about 2 minutes
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from fast_core.simulate import ComputeTimes, LinkModel, Simulation, SimulationResult, simulate
from fast_core.simulate.run import run_threads

STRATEGIES = ("allreduce", "dpsgd:ring", "async:ring", "easgd:synchronous=false")


def accuracy_at(result: SimulationResult, when: float) -> float:
    """The consensus accuracy last measured at or before ``when``."""
    return [p.accuracy for p in result.curve if p.time <= when][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    print(
        "| N | strategy | job s simulated | job s real (median, range) | ratio | largest accuracy gap to the real "
        "median | spread of the real runs at that time | largest spread of the real runs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(v) for v in args.workers.split(",")):
        for strategy in STRATEGIES:
            setup = Simulation(
                strategy,
                n,
                args.steps,
                links=LinkModel(5e9, 5e-6),
                compute=ComputeTimes(0.01, step_spread=0.2, stragglers={1: 2.0}),
            )
            real, virtual = [], None
            for repeat in range(args.repeats):
                real.append(run_threads(setup))
                if repeat == 0:
                    virtual = simulate(setup)
            assert virtual is not None
            finishes = [r.finish for r in real]
            median = statistics.median(finishes)
            times = [median * k / 10 for k in range(1, 11)]
            real_acc = np.array([[accuracy_at(r, t) for t in times] for r in real])
            sim_acc = np.array([accuracy_at(virtual, t) for t in times])
            gaps = np.abs(sim_acc - np.median(real_acc, axis=0))
            spread = real_acc.max(axis=0) - real_acc.min(axis=0)
            worst = int(np.argmax(gaps))
            print(
                f"| {n} | `{strategy}` | {virtual.finish:.3f} | {median:.3f} ({min(finishes):.3f}-{max(finishes):.3f}) "
                f"| {virtual.finish / median:.2f} | {gaps[worst]:.3f} (at {times[worst]:.2f} s) | {spread[worst]:.3f} "
                f"| {spread.max():.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
