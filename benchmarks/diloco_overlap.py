"""Streaming DiLoCo's overlap against the blocking outer exchange: bytes and the time the trainer waits.

4 in-process ranks (LocalCluster) train the tests' softmax task (tests/training.py ``train``) with
``diloco:period=8`` and ``overlap`` 0, 2 and 4; a sleep stands in for each step's compute, 4 ms, and 16 ms on one
rank drawn at random each step (the straggler moves, as with noisy real compute; the same draws for every
setting). A blocking exchange waits for the
slowest rank at each outer step; an overlapped one is waited ``overlap`` steps later, when that rank has caught up.
Prints, per setting, the bytes each rank sent and the seconds it waited (the metered engine's), averaged over ranks.

    python benchmarks/diloco_overlap.py [--steps 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np  # noqa: E402
from training import train  # noqa: E402

from fast_core import LocalCluster  # noqa: E402


def measure(spec: str, steps: int) -> tuple[float, float]:
    """(bytes sent, seconds waited), each averaged over the 4 ranks."""

    def run(engine):
        def pause(step: int) -> float:
            slow = np.random.default_rng(step).integers(engine.size)
            return 0.016 if slow == engine.rank else 0.004

        _, worker = train(engine, spec, steps=steps, pause=pause)
        return worker.metrics.bytes_sent, worker.metrics.wait_seconds

    results = LocalCluster(4, timeout=60).run(run)
    return statistics.mean(r[0] for r in results), statistics.mean(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"| strategy | bytes sent per rank | seconds waited per rank (median of {args.repeats}) |")
    print("|---|---|---|")
    for spec in ("diloco:period=8", "diloco:period=8,overlap=2", "diloco:period=8,overlap=4",
                 "diloco:period=8,fragments=2,overlap=2"):
        runs = [measure(spec, args.steps) for _ in range(args.repeats)]
        sent = runs[0][0]
        print(f"| `{spec}` | {sent:.0f} | {statistics.median(r[1] for r in runs):.4f} |", flush=True)


if __name__ == "__main__":
    main()
