"""Run the `fast` command as a user would, in a fresh process, for the CLI tests of every tox env."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

ENTRY_POINT = Path(sys.executable).parent / "fast"  # what pip installs for the `fast` entry point
FAST = [str(ENTRY_POINT)] if ENTRY_POINT.is_file() else [sys.executable, "-m", "fast_core.cli"]


def fast(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``fast args...`` with output captured (one thread per rank's math: OMP_NUM_THREADS=1)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([*FAST, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def bench(bench_dir: Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """``fast bench args... --run-dir bench_dir``; asserts it succeeded and returns it with results.csv's rows by
    label, in the table's order."""
    done = fast("bench", *args, "--run-dir", str(bench_dir), timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(bench_dir / "results.csv") as f:
        return done, {row["label"]: row for row in csv.DictReader(f)}
