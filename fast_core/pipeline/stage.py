"""The framework-neutral half of a decoupled pipeline trainer (issue 17): one rank's place in the K x D grid, the
tick loop that follows ``Schedule``, the channels to the neighbouring stages, and the evaluation stream.

An adapter's trainer subclasses ``DecoupledStage`` and gives only what needs its framework: the forward pass of a
batch (``_forward``), its backward pass and update (``_backward``), a plain forward pass on a NumPy batch
(``_predict``) and the closing of its replicas' worker (``_close_replicas``). Why here: every adapter must run the
very same schedule, so the rule lives in one place.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from fast_core.engine import Engine
from fast_core.pipeline import replica_group
from fast_core.pipeline.channel import Channel
from fast_core.pipeline.grid import Grid
from fast_core.pipeline.partition import balanced_split
from fast_core.pipeline.schedule import Schedule
from fast_core.transport.tags import PipelineTag

__all__ = ["DecoupledStage", "split_bounds"]


class DecoupledStage:
    """This rank's stage of a K x D grid: where it sits, its schedule, channels and replica group, and the ticks.

    ``window``: at most that many batches in flight (``Schedule``); None runs the full pipeline.
    """

    def __init__(self, engine: Engine, stages: int, window: int | None) -> None:
        self.engine = engine
        self.grid = grid = Grid(engine.size, stages)
        self.stage, self.replica = grid.stage(engine.rank), grid.replica(engine.rank)
        self.schedule = Schedule(stages, window=window)
        self.last = self.stage == stages - 1
        previous, following = grid.previous(engine.rank), grid.next(engine.rank)
        self._from_previous = Channel(engine, previous, PipelineTag.ACTIVATIONS) if previous is not None else None
        self._to_next = Channel(engine, following, PipelineTag.ACTIVATIONS) if following is not None else None
        self._from_next = Channel(engine, following, PipelineTag.ERRORS) if following is not None else None
        self._to_previous = Channel(engine, previous, PipelineTag.ERRORS) if previous is not None else None
        self._labels: deque[tuple[int, Any]] = deque()
        self.tick = 0
        self.batches = 0  # batches fed so far

    def _agree(self, bounds: Sequence[int]) -> list[int]:
        """Rank 0's layer boundaries on every rank (collective): measured times differ between ranks."""
        shared = np.array(bounds, dtype=np.int64)
        self.engine.broadcast(shared, 0)
        self.bounds = [int(b) for b in shared]
        return self.bounds

    def _join_replicas(self) -> Engine:
        """The engine over this stage's replicas (collective), freed by ``close``."""
        self.group = replica_group(self.engine, self.grid)
        return self.group

    # what the adapter gives -------------------------------------------------------------------------------------
    def _forward(self, batch: int, x: Any) -> None:
        """Forward ``batch`` (stage 0: the data ``x``, else the activation from ``_from_previous``), keep what its
        backward pass needs, send the output on ``_to_next``."""
        raise NotImplementedError

    def _backward(self, batch: int) -> float | None:
        """Backpropagate ``batch`` (the last stage: its loss with the labels ``_labels`` holds, else the error from
        ``_from_next``), send the input's gradient on ``_to_previous``, step the replicas; the loss, if any."""
        raise NotImplementedError

    def _predict(self, inputs: Any) -> np.ndarray:
        """The stage's output on ``inputs`` (a batch of data or a NumPy activation), no gradient, as NumPy."""
        raise NotImplementedError

    def _close_replicas(self) -> None:
        """Close the worker of the replicas' strategy."""
        raise NotImplementedError

    # the schedule -----------------------------------------------------------------------------------------------
    def step(self, x: Any = None, y: Any = None) -> float | None:
        """One tick with the next batch (``x`` used by stage 0, ``y`` by the last stage; others may pass None).
        Returns the loss of the last batch the last stage backpropagated in the ticks this call ran, else None."""
        if self.stage == 0 and x is None:
            raise ValueError("stage 0 reads the data: pass the batch's inputs x to step()")
        if self.last and y is None:
            raise ValueError("the last stage computes the loss: pass the batch's targets y to step()")
        if self.last:
            self._labels.append((self.batches, y))
        feed = self.schedule.feed_tick(self.batches)
        self.batches += 1
        loss = None
        while self.tick <= feed:  # under a window, ticks where stage 0 waits for its batches to come back first
            finished = self._tick(x if self.tick == feed else None)
            loss = finished if finished is not None else loss
        return loss

    def finish(self) -> list[float]:
        """Run the ticks that backpropagate the batches still in flight (no new batch); the losses they give."""
        losses = []
        fed = Schedule(self.schedule.stages, self.batches, self.schedule.window)
        while self.tick < fed.ticks:
            loss = self._tick(None, fed)
            if loss is not None:
                losses.append(loss)
        self.close()
        return losses

    def close(self) -> None:
        """Close the replicas' worker and the channels, and release the replica group's engine (collective;
        ``finish`` calls it). ``evaluate`` still works afterwards."""
        self._close_replicas()
        for channel in (self._from_previous, self._to_next, self._from_next, self._to_previous):
            if channel is not None:
                channel.close()
        self.group.free()

    def _tick(self, x: Any, schedule: Schedule | None = None) -> float | None:
        schedule = schedule or self.schedule
        forward, backward = (
            schedule.forward_batch(self.stage, self.tick),
            schedule.backward_batch(self.stage, self.tick),
        )
        if forward is not None:
            self._forward(forward, x)
        loss = self._backward(backward) if backward is not None else None
        self.tick += 1
        return loss

    def _labels_of(self, batch: int) -> Any:
        """The last stage's targets of ``batch`` (given to ``step`` when it was fed)."""
        labelled, y = self._labels.popleft()
        assert labelled == batch, f"the last stage backpropagates batch {batch} but its oldest labels are {labelled}"
        return y

    def evaluate(self, x: Any, y: Any, batch_size: int = 500) -> float:
        """Accuracy of the pipeline's current model on ``(x, y)`` (collective: every rank calls it between steps;
        stage 0 needs ``x``, the last stage ``y``, each replica its own part), on every rank. A forward pass only,
        on channels of its own, so batches in flight in the training pipeline are not disturbed."""
        correct = np.zeros(2)  # correct answers, examples: summed over the last stages of all replicas
        if (self.stage == 0 and x is None) or (self.last and y is None):
            raise ValueError("evaluate() needs x on stage 0 and y on the last stage")
        previous, following = self.grid.previous(self.engine.rank), self.grid.next(self.engine.rank)
        receive = Channel(self.engine, previous, PipelineTag.EVALUATION) if previous is not None else None
        send = Channel(self.engine, following, PipelineTag.EVALUATION) if following is not None else None
        start = chunk = 0
        while True:
            chunk += 1
            inputs = x[start : start + batch_size] if self.stage == 0 else receive.recv(chunk)
            if len(inputs) == 0:
                if send is not None:
                    send.send(np.asarray(inputs), chunk)
                break
            output = self._predict(inputs)
            if send is not None:
                send.send(output, chunk)
            else:
                labels = np.asarray(y[start : start + len(inputs)])
                correct += [float((output.argmax(1) == labels).sum()), len(inputs)]
            start += len(inputs)
        for channel in (receive, send):  # everything was received: the empty chunk ended the stream
            if channel is not None:
                channel.close()
        self.engine.allreduce(correct)
        return float(correct[0] / correct[1])


def split_bounds(split: str | Sequence[int], costs: Sequence[float], stages: int) -> list[int]:
    """The K + 1 layer boundaries of ``split``: "parameters" balances ``costs`` (each layer's parameter count),
    else ``split`` is the boundaries, checked."""
    if isinstance(split, str):
        if split != "parameters":
            raise ValueError(
                f"split={split!r}: give 'parameters', a sample batch to time the layers on, or the stages' layer "
                "boundaries [0, ..., n]"
            )
        return balanced_split(costs, stages)
    bounds = [int(b) for b in split]
    if len(bounds) != stages + 1 or bounds[0] != 0 or bounds[-1] != len(costs) or bounds != sorted(set(bounds)):
        raise ValueError(f"split={list(split)} must rise from 0 to {len(costs)} in {stages + 1} distinct boundaries")
    return bounds
