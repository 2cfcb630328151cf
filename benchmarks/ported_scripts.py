"""Ported public scripts on 4 ranks against the same script in one process: test accuracy and wall-clock.

Issue 14's goal: a Horovod script with its import changed, keras-io's MNIST convnet and a Flax MNIST script with
at most 5 added lines reach their one-process test accuracy within 1 point on 4 ranks. Each script runs once in
one process (no launcher: FAST's size is 1) and once under ``mpiexec -n 4`` (all-reduce unless the script names a
strategy), interleaved, ``--repeats`` times; the table gives medians. Wall-clock is the whole command, start-up
included; on this 2-core machine 4 ranks share 2 cores, so it says nothing about speed-up.

    python benchmarks/ported_scripts.py [--repeats 3] [--scripts horovod_torch_mnist,keras_mnist_convnet,...]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = {  # script -> (extra arguments, how its last line states the test accuracy, scale to a fraction)
    "horovod_torch_mnist": ((), r"Accuracy: ([0-9.]+)%", 0.01),
    "horovod_keras_mnist": ((), r"Test accuracy: ([0-9.]+)", 1.0),
    "keras_mnist_convnet": ((), r"Test accuracy: ([0-9.]+)", 1.0),
    "flax_mnist": ((), r"test accuracy ([0-9.]+)", 1.0),
}


def run(script: str, ranks: int) -> tuple[float, float]:
    """(test accuracy, seconds) of one run of ``script`` on ``ranks`` ranks (1: no launcher)."""
    args, pattern, scale = SCRIPTS[script]
    command = [sys.executable, str(EXAMPLES / f"{script}.py"), *args]
    if ranks > 1:
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
        command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", *command[1:]]
    begin = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=1200
    )
    seconds = time.perf_counter() - begin
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(re.findall(pattern, done.stdout)[-1]) * scale, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--scripts", default=",".join(SCRIPTS))
    args = parser.parse_args()
    print(
        f"| script | one process: accuracy | {args.ranks} ranks: accuracy | difference (points) | "
        f"one process: s | {args.ranks} ranks: s |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for script in args.scripts.split(","):
        single, multi = [], []
        for _ in range(args.repeats):
            single.append(run(script, 1))
            multi.append(run(script, args.ranks))
        a1, an = (statistics.median(r[0] for r in runs) for runs in (single, multi))
        s1, sn = (statistics.median(r[1] for r in runs) for runs in (single, multi))
        print(f"| `{script}` | {a1:.4f} | {an:.4f} | {100 * (an - a1):+.1f} | {s1:.1f} | {sn:.1f} |", flush=True)


if __name__ == "__main__":
    main()
