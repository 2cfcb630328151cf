"""A simulated straggler: one rank computes ``factor`` times slower, whatever the framework or script.

``fast run --straggler 3`` (or ``FAST_STRAGGLER=3`` under any launcher) makes the last rank (``FAST_STRAGGLER_RANK``
to choose another) sleep, just before each optimizer step, ``factor - 1`` times the wall time it spent since its
previous step ended: its forward and backward pass, data loading included, so the step takes ``factor`` times as
long. On a machine whose cores the ranks share, that time includes waiting for a core, as the other ranks' steps
do, so the straggler stays ``factor`` times slower than they are. A sleep rather than extra work leaves the CPU to
the other ranks. It is a Worker observer, so every adapter and script gets it, whatever threads its framework
computes on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .config import STRAGGLER_RANK_VARIABLE, STRAGGLER_VARIABLE, RunConfig
from .errors import ConfigError
from .observers import Observer

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["STRAGGLER_RANK_VARIABLE", "STRAGGLER_VARIABLE", "Straggler", "straggler_from_environment"]


class Straggler(Observer):
    """Stretches compute: ``restart()`` when a step ends, ``slow_down()`` when the next one's compute has ended."""

    def __init__(self, factor: float) -> None:
        if not factor >= 1.0:
            raise ConfigError(f"a straggler's slow-down factor must be >= 1, got {factor} (3 means three times slower)")
        self.factor = factor
        self.slept = 0.0
        self.restart()

    @classmethod
    def for_rank(cls, config: RunConfig, rank: int, size: int) -> Straggler | None:
        """The Straggler this rank plays under ``config``, or None (nothing to do, nothing to pay)."""
        if config.straggler is None:
            return None
        chosen = size - 1 if config.straggler_rank is None else config.straggler_rank
        if not 0 <= chosen < size:
            raise ConfigError(f"{STRAGGLER_RANK_VARIABLE}={chosen} is not a rank of this job (0..{size - 1})")
        if rank != chosen or config.straggler == 1.0:
            return None
        return cls(config.straggler)

    def restart(self) -> None:
        """Start timing the compute of the next step (after a step, an epoch end, or the worker's start)."""
        self._mark = time.perf_counter()

    def slow_down(self) -> None:
        """Sleep ``factor - 1`` times the compute measured since ``restart``."""
        pause = (self.factor - 1.0) * (time.perf_counter() - self._mark)
        if pause > 0:
            time.sleep(pause)
            self.slept += pause

    # as an observer: compute is what happens between a step's end and the next step's gradient hook ---------------
    def on_start(self, worker: Worker) -> None:
        self.restart()

    def on_compute_end(self, worker: Worker) -> None:
        self.slow_down()

    def on_step_end(self, worker: Worker) -> None:
        self.restart()

    def on_epoch_end(self, worker: Worker) -> None:
        self.restart()  # the epoch's evaluation is not compute to stretch

    def on_record(self, worker: Worker, kind: str, values: dict[str, Any]) -> None:
        if kind == "epoch":
            self.restart()


def straggler_from_environment(rank: int, size: int) -> Straggler | None:
    """The Straggler this rank plays under ``FAST_STRAGGLER``, or None."""
    return Straggler.for_rank(RunConfig.from_environment(), rank, size)
