"""A simulated straggler: one rank computes ``factor`` times slower, whatever the framework or script.

``fast run --straggler 3`` (or ``FAST_STRAGGLER=3`` under any launcher) makes the last rank (``FAST_STRAGGLER_RANK``
to choose another) sleep, just before each optimizer step, ``factor - 1`` times the wall time it spent since its
previous step ended: its forward and backward pass, data loading included, so the step takes ``factor`` times as
long. On a machine whose cores the ranks share, that time includes waiting for a core, as the other ranks' steps
do, so the straggler stays ``factor`` times slower than they are. A sleep rather than extra work leaves the CPU to
the other ranks. The Worker calls it, so every adapter and script gets it, whatever threads its framework computes on.
"""

from __future__ import annotations

import os
import time

from .errors import ConfigError

STRAGGLER_VARIABLE = "FAST_STRAGGLER"
STRAGGLER_RANK_VARIABLE = "FAST_STRAGGLER_RANK"


class Straggler:
    """Stretches compute: ``restart()`` when a step ends, ``slow_down()`` when the next one's compute has ended."""

    def __init__(self, factor: float) -> None:
        if not factor >= 1.0:
            raise ConfigError(f"a straggler's slow-down factor must be >= 1, got {factor} (3 means three times slower)")
        self.factor = factor
        self.slept = 0.0
        self.restart()

    def restart(self) -> None:
        """Start timing the compute of the next step (after a step, an epoch end, or the worker's start)."""
        self._mark = time.perf_counter()

    def slow_down(self) -> None:
        """Sleep ``factor - 1`` times the compute measured since ``restart``."""
        pause = (self.factor - 1.0) * (time.perf_counter() - self._mark)
        if pause > 0:
            time.sleep(pause)
            self.slept += pause


def straggler_from_environment(rank: int, size: int) -> Straggler | None:
    """The Straggler this rank plays under ``FAST_STRAGGLER``, or None (nothing to do, nothing to pay)."""
    text = os.environ.get(STRAGGLER_VARIABLE, "").strip()
    if not text:
        return None
    try:
        factor = float(text)
        chosen = int(os.environ.get(STRAGGLER_RANK_VARIABLE, "").strip() or size - 1)
    except ValueError:
        raise ConfigError(
            f"{STRAGGLER_VARIABLE}={text!r} / {STRAGGLER_RANK_VARIABLE} must be a number and a rank, e.g. 3 and 1"
        ) from None
    if not 0 <= chosen < size:
        raise ConfigError(f"{STRAGGLER_RANK_VARIABLE}={chosen} is not a rank of this job (0..{size - 1})")
    if rank != chosen or factor == 1.0:
        return None
    return Straggler(factor)
