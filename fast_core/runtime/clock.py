"""The two clocks of a rank's training: the step count (the strategy's step and round and the counters' steps move
together) and the stopwatch of each step's compute."""

from __future__ import annotations

import time

from fast_core.strategies.base import StepContext


def set_step(context: StepContext, step: int) -> None:
    """Move the step clock to ``step``: a checkpoint restores it, a recovery aligns it, each step advances it."""
    context.step = context.round = int(step)
    context.metrics.steps = int(step)


class ComputeClock:
    """Seconds of a step's compute: from the last step's end (or an epoch's end, or the start) to its gradient hook,
    so forward, backward and data loading; an epoch's evaluation is not a step's compute (``restart`` after it)."""

    def __init__(self) -> None:
        self._from = time.perf_counter()

    def restart(self) -> None:
        self._from = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self._from
