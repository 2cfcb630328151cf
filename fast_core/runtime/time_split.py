"""Where one rank's time goes (``fast run --profile``): the trainer thread's wall-clock split by phase, each phase
split into time on a core, time runnable but waiting for a core, and the rest (blocked: waiting on a peer, for the
GIL, or sleeping), plus the CPU the rank's other threads (communication, the budget's grants) took meanwhile.

The phases follow the Worker's hooks, so they mean the same under every adapter:

- ``start``: the collective start (the same model and strategy checked, rank 0's parameters sent);
- ``compute``: everything outside FAST's hooks (data, forward, backward; under Keras and JAX the framework's step);
- ``exchange``: the strategy's hooks (mixing, sends, waits on peers) and the close's last exchange;
- ``update``: between the two hooks (the optimizer's step);
- ``measurement``: the observers (records, snapshots of the consensus curve, progress bars, a straggler's sleep);
- ``budget``: claiming the next batch from the shared work budget.

Waiting for a core is the kernel's own count (``/proc/self/task/<tid>/schedstat``, Linux): a phase whose wall-clock
grows while its CPU does not, and the kernel says the thread was runnable, is a machine's cores shared, not FAST's
work. Off when not asked for (each phase change reads a clock and that file: about 10 µs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PHASES = ("start", "compute", "exchange", "update", "measurement", "budget")


class TimeSplit:
    """The trainer thread's clocks, charged to the phase it is in; ``enter`` moves it to another."""

    def __init__(self) -> None:
        self._schedstat = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
        self.phase = "start"
        self._totals = {phase: [0.0, 0.0, 0.0] for phase in PHASES}  # wall, on a core, waiting for a core
        self._begin = self._mark = self._clocks()
        self._process_cpu = time.process_time()

    def _clocks(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.thread_time(), self._core_wait()

    def _core_wait(self) -> float:
        """Seconds this thread was runnable but not running (0 where the kernel does not say)."""
        try:
            return int(self._schedstat.read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def enter(self, phase: str) -> str:
        """Charge the time since the last change to the current phase and move to ``phase``; returns the one left."""
        now = self._clocks()
        totals = self._totals[self.phase]
        for k in range(3):
            totals[k] += now[k] - self._mark[k]
        self._mark, left, self.phase = now, self.phase, phase
        return left

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """``phase`` for the body, then back to the phase it interrupted."""
        left = self.enter(phase)
        try:
            yield
        finally:
            self.enter(left)

    def summary(self) -> dict[str, float]:
        """Flat, for a record: ``time_<phase>_<part>`` seconds for each phase and part (``wall``; ``cpu``;
        ``core_wait``; ``blocked`` = wall - cpu - core_wait), ``time_wall`` (the trainer's wall-clock since the split
        began) and ``time_other_threads_cpu``: the process's CPU less the trainer's (one process per rank, as under
        ``fast run``; in a LocalCluster the ranks share one process, and this is all of theirs)."""
        self.enter(self.phase)
        out: dict[str, float] = {"time_wall": self._mark[0] - self._begin[0]}
        for phase, (wall, cpu, core_wait) in self._totals.items():
            parts = {"wall": wall, "cpu": cpu, "core_wait": core_wait, "blocked": max(wall - cpu - core_wait, 0.0)}
            out.update({f"time_{phase}_{part}": seconds for part, seconds in parts.items()})
        trainer_cpu = self._mark[1] - self._begin[1]
        out["time_other_threads_cpu"] = max(time.process_time() - self._process_cpu - trainer_cpu, 0.0)
        return out
