"""What narrows DiLoCo's loss gap to all-reduce on the byte-level LM: the outer and inner learning rates, a
synchronous warm-up, the per-worker batch and the length of the run. Loss only, so no links: 8 ranks of
``fast run`` on this machine (the runs are deterministic for a seed, so a row's loss is the one the shaped-link
runs of ``benchmarks/diloco_lm.py`` get for the same strategy and budget).

    python benchmarks/diloco_lm_tuning.py --out docs/lm/tuning.md
    python benchmarks/diloco_lm_tuning.py --cases batch64 --out /tmp/tuning.md

About an hour and three quarters on 2 cores (steps2000 19 minutes, seed1 5, cosine 5, batch64 7, steps8000 30,
steps16000 40).

Each case is a group of runs with the same budget (steps per worker, batch, corpus): all-reduce first, then DiLoCo
variants, each compared with that group's all-reduce. Per run: the consensus model's final validation loss and the
bytes rank 0 sent (FAST's own counter, from its close record).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fast_core.observers.runlog import read_run

FULL_CORPUS = ["--max-corpus-bytes", "100000000"]
"""The whole standard library's source (about 30 MB) rather than tiny's first 4 MB: long runs would repeat it."""


@dataclass(frozen=True)
class Case:
    """Runs sharing one budget: ``budget`` are the example's arguments, ``variants`` (strategy, own arguments)."""

    name: str
    budget: list[str]
    variants: list[tuple[str, list[str]]]


CASES = [
    Case(
        "steps2000",
        ["--epochs", "10", "--steps-per-epoch", "200"],
        [
            ("allreduce", []),
            ("diloco:period=100", []),
            ("diloco:period=100,outer_lr=0.5", []),
            ("diloco:period=100,outer_lr=1.0", []),
            ("diloco:period=100,outer_lr=1.5", []),
            ("diloco:period=100", ["--lr", "0.006"]),
            ("diloco:period=100", ["--lr", "0.0015"]),
            ("diloco:period=100,warmup=500", []),
        ],
    ),
    Case(
        "seed1",
        ["--epochs", "10", "--steps-per-epoch", "200", "--seed", "1"],
        [("allreduce", []), ("diloco:period=100", [])],
    ),
    Case(
        "cosine",
        ["--epochs", "10", "--steps-per-epoch", "200", "--cosine"],
        [("allreduce", []), ("diloco:period=100", [])],
    ),
    Case(
        "batch64",
        ["--epochs", "5", "--steps-per-epoch", "100", "--batch-size", "64", *FULL_CORPUS],
        [("allreduce", []), ("diloco:period=50", [])],
    ),
    Case(
        "steps8000",
        ["--epochs", "8", "--steps-per-epoch", "1000", *FULL_CORPUS],
        [("allreduce", []), ("diloco:period=100", []), ("diloco:period=500", [])],
    ),
    Case(
        "steps16000",
        ["--epochs", "16", "--steps-per-epoch", "1000", *FULL_CORPUS],
        [("allreduce", []), ("diloco:period=100", [])],
    ),
]


def run(strategy: str, arguments: list[str], ranks: int, folder: Path) -> dict:
    """One ``fast run`` of the tiny LM: its consensus model's final loss, rank 0's bytes sent and its replica's
    validation loss at each epoch's end."""
    command = [sys.executable, "-m", "fast_core.cli", "run", "-n", str(ranks), "--strategy", strategy]
    command += ["--no-progress", "--run-dir", str(folder), "-m", "fast_examples.torch_lm", "--size", "tiny"]
    command += ["--snapshot-every", "100000", *arguments]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = read_run(folder)[0]
    result = next(r for r in records if r["kind"] == "result")
    close = next(r for r in records if r["kind"] == "close")
    curve = [r["val_loss"] for r in records if r["kind"] == "epoch"]
    return {"val_loss": result["val_loss"], "bytes": close["bytes_sent"], "steps": close["step"], "curve": curve}


def table(case: Case, rows: list[tuple[str, list[str], dict]]) -> str:
    base = rows[0][2]
    lines = [
        f"Case `{case.name}`: `--size tiny {' '.join(case.budget)}`, {base['steps']} steps per worker.\n",
        "| strategy | own arguments | final val. loss (consensus) | vs all-reduce | MB sent by rank 0 | fewer bytes |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for strategy, own, row in rows:
        lines.append(
            f"| `{strategy}` | {' '.join(own) or '-'} | {row['val_loss']:.4f} "
            f"| {row['val_loss'] / base['val_loss'] - 1:+.1%} | {row['bytes'] / 1e6:.1f} "
            f"| {base['bytes'] / row['bytes']:.0f}x |"
        )
    lines.append("\nAgainst all-reduce at each evaluation (rank 0's replica, after each epoch of the budget):\n")
    for strategy, own, row in rows[1:]:
        gaps = ", ".join(f"{mine / theirs - 1:+.1%}" for mine, theirs in zip(row["curve"], base["curve"], strict=True))
        lines.append(f"- `{strategy}`{''.join(' ' + a for a in own)}: {gaps}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], default=[c.name for c in CASES])
    parser.add_argument("-n", "--ranks", type=int, default=8)
    parser.add_argument("--out", type=Path, help="write the tables here too (markdown)")
    args = parser.parse_args()
    parts = [
        f"# DiLoCo on the LM: what closes the gap\n\n`python benchmarks/diloco_lm_tuning.py --cases "
        f"{' '.join(args.cases)}`: {args.ranks} ranks of `fast run` on one machine, no shaped links (loss and bytes "
        "only), one run per row. Losses compare only within a case: the cases differ in budget, and the ones that read "
        "the whole library score a larger held-out text.\n"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for case in (c for c in CASES if c.name in args.cases):
            rows = []
            for index, (strategy, own) in enumerate(case.variants):
                row = run(strategy, [*case.budget, *own], args.ranks, Path(tmp) / f"{case.name}-{index}")
                print(f"{case.name} {strategy} {' '.join(own)}: loss {row['val_loss']:.4f}", flush=True)
                rows.append((strategy, own, row))
            parts.append(table(case, rows))
    text = "\n".join(parts)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
