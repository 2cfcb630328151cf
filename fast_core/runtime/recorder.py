"""What a script tells its observers (under ``fast run``: the run records and the progress bar), reached as
``worker.records``; free when no observer wants records."""

from __future__ import annotations

from fast_core.observers.base import Observers
from fast_core.observers.events import Recorded
from fast_core.runtime.clock import ComputeClock
from fast_core.strategies.base import StepContext


class Recorder:
    """``step`` each step, ``epoch`` at an epoch's end, ``result`` at the end, ``consensus`` for the consensus
    curve's points; ``wanted`` says whether anyone listens (check it before computing a number only records need)."""

    def __init__(self, observers: Observers, context: StepContext, clock: ComputeClock) -> None:
        self._observers = observers
        self._context = context
        self._clock = clock

    @property
    def wanted(self) -> bool:
        """True when an observer wants the records (under ``fast run``)."""
        return self._observers.wanted

    def step(self, **values: float) -> None:
        """This step's numbers, e.g. ``step(loss=0.3, samples=32)``: averaged between records (``samples`` adds
        up)."""
        self._record("step", values)

    def epoch(self, **values: float) -> None:
        """One "epoch" record now, e.g. ``epoch(val_accuracy=0.93, loss=0.2)``, with the counters and the last
        consensus distance computed (epochs are counted unless ``epoch=`` is given)."""
        self._clock.restart()  # the epoch's evaluation is not a step's compute
        self._record("epoch", values)

    def consensus(self, **values: float) -> None:
        """One "consensus" record: a value of the consensus (averaged) model at a wall-clock point, e.g.
        ``consensus(time=12.5, val_accuracy=0.91)`` with ``time`` in seconds since the common start
        (``fast_core.runtime.consensus_curve`` computes them after training; rank 0 records them, also after
        ``close()``)."""
        self._record("consensus", values)

    def result(self, **values: float) -> None:
        """Final numbers of the run, e.g. ``result(test_accuracy=0.95)``, also after ``close()``."""
        self._record("result", values)

    def _record(self, kind: str, values: dict[str, float]) -> None:
        if len(self._observers):
            self._observers.announce(Recorded(self._context.step, kind, values))
