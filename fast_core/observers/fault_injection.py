"""A NaN injected into a running rank on demand, for chaos runs (``benchmarks/chaos.py --fault nan``, ``--soak``).

Under ``FAST_INJECT_FAULTS=1`` each rank's main thread takes SIGUSR1 as "your parameters turn NaN now": at the end
of its next step the rank's parameters are overwritten with NaN, as a diverging step or a bad batch would leave them.
What follows is FAST's own handling, unchanged: the rank's next own-parameter check (``integrity.check_own``, every
8th mixing round) finds it, and a fault-tolerant job goes on without that rank (``survival.leave``); a NaN message
that reached a neighbour first is refused there. Nothing is injected unless the variable is set.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import numpy as np

from fast_core.observers.base import Observer
from fast_core.observers.events import StepEnded


class NaNOnSignal(Observer):
    """Turns the parameters NaN at the step after SIGUSR1. ``params``/``set_params``: the rank's model adapter's."""

    def __init__(self, params: Callable[[], np.ndarray], set_params: Callable[[np.ndarray], None]) -> None:
        self._params, self._set_params = params, set_params
        self._asked = threading.Event()
        if threading.current_thread() is threading.main_thread():  # a signal handler lives in the main thread
            signal.signal(signal.SIGUSR1, lambda number, frame: self._asked.set())

    def inject(self) -> None:
        """Ask for the NaN as SIGUSR1 does (tests and in-process ranks, which cannot take a signal each)."""
        self._asked.set()

    def on_step_end(self, event: StepEnded) -> None:
        if self._asked.is_set():
            self._asked.clear()
            self._set_params(np.full_like(self._params(), np.nan))
