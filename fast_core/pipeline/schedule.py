"""When each stage of a fully decoupled pipeline forwards and backpropagates which batch.

K stages (0 .. K-1) advance together one tick at a time, but none waits inside a tick for another's forward or
backward pass: everything a stage reads at tick t was sent at tick t - 1. At tick t stage k

- forwards batch ``t - k`` (the activation stage k - 1 sent at tick t - 1; stage 0 reads the data) and sends its
  output to stage k + 1;
- backpropagates batch ``t - 2(K - 1) + k`` (the error gradient stage k + 1 sent at tick t - 1; the last stage
  uses its own loss of the batch it just forwarded) through the graph of its own forward pass of that batch, sends
  the gradient of its input to stage k - 1, and updates its current weights with that gradient.

So stage k updates with a gradient ``delay(k) = 2 (K - 1 - k)`` ticks old, computed at the weights it had when it
forwarded the batch: the delayed gradient of Huo et al. (2018), whose decoupled backpropagation counts K - k when
the forward pass stays locked; fully decoupled (Zhuang et al.), the activations take one tick per stage forward
and the gradients one per stage back. A stage therefore keeps the inputs, and a copy of the weights, of its
``delay(k) + 1`` newest forwarded batches (PipeDream calls the copies weight stashing). With K = 1 every tick
forwards, backpropagates and updates the same batch: plain training, and with replicas plain data parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """The tick schedule of ``stages`` stages over ``batches`` batches (None: an endless stream).

    ``window``: at most that many batches in flight (forwarded by stage 0, not yet backpropagated there), which
    bounds every stage's staleness to ``window - 1`` updates; None (or 2K - 1 and above) is the full pipeline. Stage
    0 then feeds ``window`` batches in a row and waits until its first comes back: a period of 2K - 1 ticks holds
    ``window`` batches, so the pipeline trades speed for fresher gradients (``window=1``: no delay at all, the
    gradient of plain training, one stage busy at a time).
    """

    stages: int
    batches: int | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got stages={self.stages}")
        if self.batches is not None and self.batches < 0:
            raise ValueError(f"batches must be >= 0 or None, got {self.batches}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 batch in flight (or None for the full pipeline), got {self.window}")

    @property
    def period(self) -> int:
        """Ticks from a batch's feeding to its last backward pass, plus one: 2K - 1."""
        return 2 * self.stages - 1

    @property
    def in_flight(self) -> int:
        """The most batches in flight at once."""
        return self.period if self.window is None else min(self.window, self.period)

    def delay(self, stage: int) -> int:
        """Ticks between stage ``stage``'s forward and backward pass of one batch."""
        self._check(stage)
        return 2 * (self.stages - 1 - stage)

    def staleness(self, stage: int) -> int:
        """Updates stage ``stage`` makes between its forward and backward pass of one batch, at most."""
        return min(self.delay(stage), self.in_flight - 1)

    def feed_tick(self, batch: int) -> int:
        """The tick at which stage 0 forwards ``batch``."""
        group, index = divmod(batch, self.in_flight)
        return group * self.period + index

    def forward_batch(self, stage: int, tick: int) -> int | None:
        """The batch ``stage`` forwards at ``tick``, or None (the pipeline is filling, waiting or drained)."""
        return self._batch(tick - stage)

    def backward_batch(self, stage: int, tick: int) -> int | None:
        """The batch ``stage`` backpropagates (and updates with) at ``tick``, or None."""
        return self._batch(tick - self.delay(stage) - stage)

    @property
    def ticks(self) -> int | None:
        """Ticks until every batch has been backpropagated by every stage (None for an endless stream)."""
        if self.batches is None:
            return None
        return self.feed_tick(self.batches - 1) + 2 * (self.stages - 1) + 1 if self.batches else 0

    def _batch(self, offset: int) -> int | None:
        """The batch stage 0 fed at tick ``offset``, if any."""
        if offset < 0:
            return None
        group, index = divmod(offset, self.period)
        if index >= self.in_flight:
            return None
        batch = group * self.in_flight + index
        return None if self.batches is not None and batch >= self.batches else batch

    def _check(self, stage: int) -> None:
        if not 0 <= stage < self.stages:
            raise ValueError(f"stage {stage} is not one of 0..{self.stages - 1}")
