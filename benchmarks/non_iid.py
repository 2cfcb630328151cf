"""Shards split by label (each rank sees a few digits) against shuffled shards: what non-IID data does to D-PSGD,
and what gradient tracking and quasi-global momentum win back, side by side in one run, interleaved, medians.

Each row is ``fast run -n N --strategy S -m fast_examples.numpy_digits --shards label|iid`` (softmax regression
on scikit-learn's digits, a shared budget of ``--epochs`` global epochs); the example prints the test accuracy of
the averaged (consensus) model and of the worst rank's own model, the one a decentralized job serves from a rank.

    python benchmarks/non_iid.py --ranks 8 --repeats 3 --epochs 10 > docs/non_iid.md
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile

ROWS = [  # (label, strategy, example options)
    ("all-reduce", "allreduce", []),
    ("D-PSGD", "dpsgd:ring", []),
    ("D-PSGD, local momentum 0.9", "dpsgd:ring", ["--momentum", "0.9"]),
    ("D-PSGD, quasi-global momentum 0.9", "dpsgd:ring,qgm=0.9", []),
    ("gradient tracking", "tracking:ring", []),
    ("CHOCO-SGD top-10%", "choco:ring", []),
    ("CHOCO-SGD int8", "choco:ring,compress=int8", []),
]


def launch(ranks: int, strategy: str, options: list[str], shards: str, epochs: int, lr: float) -> tuple[float, float]:
    """(averaged model's, worst rank's own model's) test accuracy of one ``fast run``."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "fast_core.cli", "run", "-n", str(ranks), "--strategy", strategy]
        command += ["--run-dir", f"{folder}/run", "-m", "fast_examples.numpy_digits", "--shards", shards]
        command += ["--epochs", str(epochs), "--lr", str(lr), *options]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    averaged = re.search(r"test accuracy of the averaged model: ([0-9.]+)", out)
    worst = re.search(r"test accuracy of the worst rank's own model: ([0-9.]+)", out)
    if done.returncode != 0 or averaged is None or worst is None:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{out[-3000:]}")
    return float(averaged.group(1)), float(worst.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):  # interleaved: every row once per round
        for label, strategy, options in ROWS:
            for shards in ("iid", "label"):
                measured = launch(args.ranks, strategy, options, shards, args.epochs, args.lr)
                results.setdefault((label, shards), []).append(measured)
    print(f"# Shards split by label: {args.ranks} ranks, digits, {args.epochs} global epochs, lr {args.lr}\n")
    print(f"`python benchmarks/non_iid.py --ranks {args.ranks} --repeats {args.repeats} --epochs {args.epochs}`: ")
    print(f"test accuracy, medians of {args.repeats} interleaved repeats (consensus: the averaged model; worst:")
    print("the worst rank's own model).\n")
    print("| strategy | shuffled shards: consensus / worst | split by label: consensus / worst |")
    print("|---|---|---|")
    for label, strategy, options in ROWS:
        cells = []
        for shards in ("iid", "label"):
            runs = results[(label, shards)]
            consensus = statistics.median(r[0] for r in runs)
            worst = statistics.median(r[1] for r in runs)
            cells.append(f"{consensus:.4f} / {worst:.4f}")
        spelled = f"`{strategy}`" + (f" `{' '.join(options)}`" if options else "")
        print(f"| {label} ({spelled}) | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
