"""What observers hear: one small frozen record per event of a rank's training, never the Worker itself.

Each record names the Observer method that receives it (``handler``), so the runtime announces every event the same
way (``Observers.announce``). Every record carries ``step``: the optimizer steps taken when it happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fast_core.metrics import Metrics


@dataclass(frozen=True)
class Started:
    """Training starts: every rank holds the same parameters and the strategy is set up."""

    handler: ClassVar[str] = "on_start"
    step: int
    size: int
    """Ranks in the group."""
    strategy: str
    """The strategy as ``repr`` shows it (topology and options included)."""
    strategy_name: str
    started_at: float
    """``time.monotonic()`` at the common start: the origin of wall-clock points, the same moment on every rank up
    to a message latency."""
    metrics: Metrics = field(repr=False, compare=False)
    """The worker's live counters: read them (``as_dict()``) when a record needs them."""
    budget_samples: int | None = None
    budget_seconds: float | None = None


@dataclass(frozen=True)
class ComputeEnded:
    """This step's forward and backward passes are done; the strategy's gradient hook runs next."""

    handler: ClassVar[str] = "on_compute_end"
    step: int
    compute_seconds: float
    """This step's compute: from the last step's end (or an epoch's end, or the start) to its gradient hook, so
    forward, backward and data loading; measured once, before any observer runs (a straggler's sleep is not in it)."""


@dataclass(frozen=True)
class StepEnded:
    """The step is complete (optimizer and strategy) and ``step`` counts it."""

    handler: ClassVar[str] = "on_step_end"
    step: int


@dataclass(frozen=True)
class EpochEnded:
    """The script ended an epoch (evaluation follows or just happened: not compute of a step)."""

    handler: ClassVar[str] = "on_epoch_end"
    step: int


@dataclass(frozen=True)
class Recorded:
    """The script recorded ``values``: ``kind`` is "step", "epoch", "result" or "consensus"."""

    handler: ClassVar[str] = "on_record"
    step: int
    kind: str
    values: Mapping[str, Any]


@dataclass(frozen=True)
class Recovered:
    """A change of the group survived (a fault-tolerant engine): ranks lost, or workers that joined; it goes on from
    ``step``."""

    handler: ClassVar[str] = "on_recovery"
    step: int
    lost: tuple[int, ...]
    """Launch numbers of the ranks lost."""
    replaced: tuple[int, ...]
    """Launch numbers whose ranks new processes took over (``fast run --max-restarts``)."""
    size: int
    """The group's size after the recovery."""
    detected_at: float
    """``time.time()`` when this rank learned of the loss (its PeerLost)."""
    recovered_at: float
    """``time.time()`` when it went on training."""
    joined: tuple[int, ...] = ()
    """New launch numbers, taken by workers that asked to join the job (``fast run --join``)."""

    def as_record(self) -> dict[str, float | int | str]:
        """The run records' "membership" values."""
        return {
            "lost": ",".join(map(str, self.lost)),
            "replaced": ",".join(map(str, self.replaced)),
            "joined": ",".join(map(str, self.joined)),
            "step": self.step,
            "size": self.size,
            "detected_at": self.detected_at,
            "recovery_seconds": self.recovered_at - self.detected_at,
        }


@dataclass(frozen=True)
class Closed:
    """The worker closed: no more steps (results may still be recorded)."""

    handler: ClassVar[str] = "on_close"
    step: int
    time_split: dict[str, float] | None = None
    """Where this rank's time went, by phase, under ``fast run --profile`` (TimeSplit.summary); None otherwise."""


Event = Started | ComputeEnded | StepEnded | EpochEnded | Recorded | Recovered | Closed
