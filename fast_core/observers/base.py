"""What watches a rank's training without taking part in it: one small interface, so the runtime announces each
event once for all observers instead of checking which ones exist.

Observers hear event records (``fast_core.observers.events``), never the Worker: what one needs beyond the records
(a rank's parameters, the run folder) it is given when it is made. The run configuration's observers (the Reporter,
the simulated Straggler) are made by the runtime's builder (``fast_core.runtime.builder``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from fast_core.observers.events import (
    Closed,
    ComputeEnded,
    EpochEnded,
    Event,
    Recorded,
    Recovered,
    Started,
    StepEnded,
)

Watcher = TypeVar("Watcher", bound="Observer")


class Observer:
    """Events of a rank's training; every one defaults to doing nothing."""

    records = False
    """True when the observer wants the script's records (scripts skip computing them otherwise)."""

    def on_start(self, event: Started) -> None:
        """Training starts: every rank holds the same parameters and the strategy is set up."""

    def on_compute_end(self, event: ComputeEnded) -> None:
        """This step's forward and backward passes are done; the strategy's gradient hook runs next."""

    def on_step_end(self, event: StepEnded) -> None:
        """The step is complete (optimizer and strategy) and ``event.step`` counts it."""

    def on_epoch_end(self, event: EpochEnded) -> None:
        """The script ended an epoch (evaluation follows or just happened: not compute of a step)."""

    def on_record(self, event: Recorded) -> None:
        """The script recorded values: ``event.kind`` is "step", "epoch", "result" or "consensus"."""

    def on_recovery(self, event: Recovered) -> None:
        """The group lost ranks and went on without them (or with their replacements)."""

    def on_close(self, event: Closed) -> None:
        """The worker closed: no more steps."""


class Observers:
    """A rank's observers, in the order they hear each event. One added after the start hears that start at once."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers = list(observers)
        self._started: Started | None = None

    def __iter__(self) -> Iterator[Observer]:
        return iter(self._observers)

    def __len__(self) -> int:
        return len(self._observers)

    @property
    def wanted(self) -> bool:
        """True when an observer wants the script's records."""
        return any(observer.records for observer in self._observers)

    def attach(self, observer: Watcher) -> Watcher:
        """Add ``observer``; if training has started, it hears the start now (with its original time)."""
        self._observers.append(observer)
        if self._started is not None:
            observer.on_start(self._started)
        return observer

    def announce(self, event: Event) -> None:
        """Tell every observer, in order."""
        if isinstance(event, Started):
            self._started = event
        for observer in self._observers:
            getattr(observer, event.handler)(event)
