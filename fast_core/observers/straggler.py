"""A simulated straggler: one rank made slower, whatever the framework or script, in one of two forms.

Relative (``fast run --straggler 3``, ``FAST_STRAGGLER=3``): the last rank (``FAST_STRAGGLER_RANK`` to choose
another) sleeps, just before each optimizer step, ``factor - 1`` times the wall time it spent since its previous
step ended: its forward and backward pass, data loading included, so the step takes ``factor`` times as long. On a
machine whose cores the ranks share, that time includes waiting for a core, as the other ranks' steps do. It also
includes any communication the training does inside backward (torch DDP all-reduces gradients there), so it slows
such a run more than one whose strategy communicates after that point.

Fixed (``--straggler-seconds S``, ``FAST_STRAGGLER_SECONDS=S``): the rank sleeps exactly ``S`` seconds at the same
point of every step, whatever the strategy, so DDP, all-reduce and the asynchronous strategies lose the same time.
``fast bench --straggler F`` uses it: a first launch with no communication measures the straggler rank's compute
per step (``compute_per_step``, from the "compute_seconds" its records carry), then every run of the bench gets
``calibrated_seconds(F, compute)`` = ``(F - 1) x compute`` seconds per step.

A sleep rather than extra work leaves the CPU to the other ranks. It is a Worker observer, so every adapter and
script gets it, whatever threads its framework computes on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from fast_core.config.run import STRAGGLER_RANK_VARIABLE, STRAGGLER_SECONDS_VARIABLE, STRAGGLER_VARIABLE, RunConfig
from fast_core.errors import ConfigError
from fast_core.observers.base import Observer
from fast_core.observers.events import ComputeEnded

__all__ = [
    "STRAGGLER_RANK_VARIABLE",
    "STRAGGLER_SECONDS_VARIABLE",
    "STRAGGLER_VARIABLE",
    "Straggler",
    "calibrated_seconds",
    "compute_per_step",
]


class Straggler(Observer):
    """Stretches each step once its compute has ended (``on_compute_end``), by the worker's measure of that compute
    (``ComputeEnded.compute_seconds``: from the last step's end to the gradient hook, evaluations excluded).

    ``Straggler(3.0)`` is the relative form; ``Straggler(seconds=0.02)`` the fixed one. ``slept`` and ``steps``
    count what it did (the Reporter copies ``slept`` into the "close" record).
    """

    def __init__(self, factor: float = 1.0, *, seconds: float | None = None) -> None:
        if not factor >= 1.0:
            raise ConfigError(f"a straggler's slow-down factor must be >= 1, got {factor} (3 means three times slower)")
        if seconds is not None and not 0.0 <= seconds < float("inf"):
            raise ConfigError(f"a fixed straggler sleeps seconds >= 0 per step, got {seconds}")
        self.factor = factor
        self.seconds = seconds
        self.slept = 0.0
        self.steps = 0

    @classmethod
    def for_rank(cls, config: RunConfig, rank: int, size: int) -> Straggler | None:
        """The Straggler this rank plays under ``config``, or None (nothing to do, nothing to pay)."""
        if config.straggler is None and config.straggler_seconds is None:
            return None
        chosen = size - 1 if config.straggler_rank is None else config.straggler_rank
        if not 0 <= chosen < size:
            raise ConfigError(f"{STRAGGLER_RANK_VARIABLE}={chosen} is not a rank of this job (0..{size - 1})")
        if rank != chosen:
            return None
        if config.straggler_seconds is not None:
            return cls(seconds=config.straggler_seconds) if config.straggler_seconds > 0 else None
        return cls(config.straggler) if config.straggler != 1.0 else None

    def slow_down(self, compute_seconds: float) -> None:
        """Sleep the fixed seconds, or ``factor - 1`` times ``compute_seconds`` (the step's compute)."""
        pause = self.seconds if self.seconds is not None else (self.factor - 1.0) * compute_seconds
        self.steps += 1
        if pause > 0:
            time.sleep(pause)
            self.slept += pause

    def on_compute_end(self, event: ComputeEnded) -> None:
        self.slow_down(event.compute_seconds)


# calibration (fast bench --straggler F) ----------------------------------------------------------------------------
def compute_per_step(records: Sequence[dict[str, Any]]) -> float | None:
    """Seconds of compute per step in one rank's records (the Reporter's cumulative "compute_seconds": from a step's
    end to the next step's gradient hook, as the relative straggler measures it).

    With two step records or more, the steps between the first and the last one (the first steps pay one-time
    costs: lazy initialisation, caches); else the "close" record's totals. None when nothing was measured.
    """
    steps = [r for r in records if r.get("kind") == "step" and r.get("compute_seconds") is not None]
    if len(steps) >= 2 and steps[-1]["step"] > steps[0]["step"]:
        first, final = steps[0], steps[-1]
        return (final["compute_seconds"] - first["compute_seconds"]) / (final["step"] - first["step"])
    close = next((r for r in reversed(records) if r.get("kind") == "close"), None)
    if close and close.get("step") and close.get("compute_seconds") is not None:
        return close["compute_seconds"] / close["step"]
    return None


def calibrated_seconds(factor: float, compute: float) -> float:
    """The fixed sleep per step that makes a rank whose step computes ``compute`` seconds ``factor`` times slower."""
    if not factor >= 1.0:
        raise ConfigError(f"a straggler's slow-down factor must be >= 1, got {factor} (3 means three times slower)")
    if not compute >= 0.0:
        raise ConfigError(f"a measured compute per step must be >= 0 seconds, got {compute}")
    return (factor - 1.0) * compute
