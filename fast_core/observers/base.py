"""What watches a Worker without taking part in training: one small interface, so the Worker calls each event
once for all observers instead of checking which ones exist.

Two observers come with FAST, both asked for by the run configuration (``fast run``): the Reporter (records, the
progress bar, verbose lines) and the simulated Straggler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fast_core.runtime.worker import Worker


class Observer:
    """Events of a Worker's life; every one defaults to doing nothing."""

    records = False
    """True when the observer wants the script's ``record*`` values (scripts skip computing them otherwise)."""

    def on_start(self, worker: Worker) -> None:
        """Training starts: every rank holds the same parameters and the strategy is set up."""

    def on_compute_end(self, worker: Worker) -> None:
        """This step's forward and backward passes are done; the strategy's gradient hook runs next."""

    def on_step_end(self, worker: Worker) -> None:
        """The step is complete (optimizer and strategy) and ``worker.step`` counts it."""

    def on_epoch_end(self, worker: Worker) -> None:
        """The script ended an epoch (evaluation follows or just happened: not compute of a step)."""

    def on_record(self, worker: Worker, kind: str, values: dict[str, Any]) -> None:
        """The script recorded ``values``: ``kind`` is "step", "epoch", "result" or "consensus"."""

    def on_close(self, worker: Worker) -> None:
        """The worker closed: no more steps."""
