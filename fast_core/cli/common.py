"""What every subcommand shares: the user-facing error, messages on stderr, checks of strategy, topology and N."""

from __future__ import annotations

import datetime
import os
import re
import sys
from pathlib import Path

from fast_core.config.current import run_config
from fast_core.strategies import Strategy
from fast_core.strategies.spec import StrategySpec
from fast_core.topology import make_topology


class CLIError(Exception):
    """A mistake the user can fix: printed as ``fast: error: <message>`` with exit status 2, no traceback."""


def say(message: str) -> None:
    print(f"fast: {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"fast: warning: {message}", file=sys.stderr, flush=True)


class DefaultCount(int):
    """An option's default number, told apart from the same number given (``fast run --slurm`` takes every task
    SLURM allocated unless ``-n`` is given)."""


def positive(text: str) -> int:
    """argparse type: a whole number >= 1 (ranks, steps)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(text)
    return int(text)


def whole(text: str) -> int:
    """argparse type: a whole number >= 0 (restarts)."""
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


def warn_if_oversubscribed(workers: int, hostfile: str | None) -> None:
    """More workers than CPUs is allowed (MPICH runs them), but the user should know what their numbers mean."""
    cpus = os.cpu_count() or 1
    if hostfile is None and workers > cpus:
        warn(
            f"{workers} workers on a machine with {cpus} CPUs (os.cpu_count() = {cpus}): they share the cores, so "
            "each computes slower and steps/s measure the sharing; fine to compare strategies side by side, "
            f"use -n {cpus} or --hostfile for real throughput"
        )


def check_strategy(spec: StrategySpec, topology: str | None, workers: int) -> Strategy:
    """The strategy the ranks will build from ``spec`` and the run's ``topology`` (given here, else the one already
    in this environment), built here first so that a bad option value is one message now rather than a traceback
    on every rank; named topologies are built for ``workers`` ranks."""
    effective = spec.with_run_topology(topology or run_config().topology)
    strategy = effective.build()
    if isinstance(effective.topology, str):
        make_topology(effective.topology, workers)
    if topology:
        make_topology(topology, workers)
        if spec.with_run_topology(topology) == spec:
            warn(f"--topology {topology} is not used: strategy '{spec}' names its own topology or takes none")
    return strategy


def slug(text: str) -> str:
    """A strategy string as a folder name: ``async:torus,staleness=1`` -> ``async-torus-staleness-1``."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-") or "run"


def new_run_dir(name: str, parent: Path = Path("runs")) -> Path:
    """``runs/<date>-<time>-<name>``, with a counter if two runs start in the same second."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = parent / f"{stamp}-{slug(name)}"
    count = 1
    while path.exists():
        count += 1
        path = parent / f"{stamp}-{slug(name)}-{count}"
    return path
