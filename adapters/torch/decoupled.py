"""Data parallelism with fully decoupled parallel backpropagation: a ``torch.nn.Sequential`` split into K stages
on K ranks, each stage replicated D times (K x D ranks), no stage waiting for another's forward or backward pass.

Each tick every stage forwards the newest activation from the stage before and backpropagates the error gradient
the stage after sent for an earlier batch (``fast_core.pipeline.schedule``: stage k's gradient is 2 (K - 1 - k)
ticks old, computed at the weights it forwarded that batch with), then takes a step of the user's optimizer. Its
D replicas (same stage, different data) mix through any FAST strategy over their own group of ranks: all-reduce
by default, D-PSGD, asynchronous averaging... With K = 1 it is plain data parallelism.

    trainer = fast_torch.DecoupledTrainer(model, stages=2, optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                                          loss_fn=torch.nn.functional.cross_entropy)
    for x, y in loader:              # the same batches on the ranks of one replica: its shard of the data
        trainer.step(x, y)           # stage 0 reads x, the last stage y; returns the loss the last stage finished
    trainer.finish()                 # drain the batches still in flight
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import numpy as np

import torch
from fast_core import Engine, Strategy
from fast_core.pipeline import Channel, Grid, PipelineTag, replica_group
from fast_core.pipeline.partition import balanced_split
from fast_core.pipeline.schedule import Schedule
from fast_core.runtime import init as default_engine

from .optimizer import DistributedOptimizer


class DecoupledTrainer:
    """This rank's stage of a K x D grid: its layers, optimizer, channels to the neighbouring stages, and its
    replicas' FAST strategy.

    ``window``: at most that many batches in flight, which bounds each stage's gradient to ``window - 1`` updates
    old (``fast_core.pipeline.schedule``); None runs the full pipeline. ``split``: "parameters" balances the
    stages' parameter counts, a sample batch (a tensor) their forward and backward time measured on it (rank 0's
    measurement for all), or give the K + 1 layer boundaries. Every rank
    builds the whole model the same way (the same seed) and keeps its stage's layers; a stage's replicas start
    from their group's rank 0.
    """

    def __init__(
        self,
        model: torch.nn.Sequential | Sequence[torch.nn.Module],
        stages: int,
        optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        strategy: Strategy | str | None = None,
        *,
        split: str | Sequence[int] | torch.Tensor = "parameters",
        window: int | None = None,
        engine: Engine | None = None,
    ) -> None:
        layers = list(model)
        engine = engine or default_engine()
        self.engine = engine
        self.grid = grid = Grid(engine.size, stages)
        self.stage, self.replica = grid.stage(engine.rank), grid.replica(engine.rank)
        bounds = np.array(_bounds(layers, stages, split), dtype=np.int64)
        engine.broadcast(bounds, 0)  # measured times differ between ranks: rank 0's split for all
        self.bounds = [int(b) for b in bounds]
        self.module = torch.nn.Sequential(*layers[self.bounds[self.stage] : self.bounds[self.stage + 1]])
        self.loss_fn = loss_fn
        self.schedule = Schedule(stages, window=window)
        self.last = self.stage == stages - 1
        self.group = replica_group(engine, grid)
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            raise ValueError(
                f"stage {self.stage} (layers {self.bounds[self.stage]}..{self.bounds[self.stage + 1]}) "
                "has no trainable parameter: give other split boundaries"
            )
        self.optimizer = DistributedOptimizer(optimizer(params), self.module, strategy, engine=self.group)
        previous, following = grid.previous(engine.rank), grid.next(engine.rank)
        self._from_previous = Channel(engine, previous, PipelineTag.ACTIVATIONS) if previous is not None else None
        self._to_next = Channel(engine, following, PipelineTag.ACTIVATIONS) if following is not None else None
        self._from_next = Channel(engine, following, PipelineTag.ERRORS) if following is not None else None
        self._to_previous = Channel(engine, previous, PipelineTag.ERRORS) if previous is not None else None
        self._stash: deque[tuple[int, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = deque()
        """(batch, input, output with its graph, the weights that graph holds) of each batch in flight"""
        self._labels: deque[tuple[int, torch.Tensor]] = deque()
        self.tick = 0
        self.batches = 0  # batches fed so far

    def step(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> float | None:
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
        self.optimizer.fast_worker.close()
        for channel in (self._from_previous, self._to_next, self._from_next, self._to_previous):
            if channel is not None:
                channel.close()
        self.group.free()

    def evaluate(self, x: torch.Tensor | None, y: torch.Tensor | None, batch_size: int = 500) -> float:
        """Accuracy of the pipeline's current model on ``(x, y)`` (collective: every rank calls it between steps;
        stage 0 needs ``x``, the last stage ``y``, each replica its own part), on every rank. A forward pass only,
        on channels of its own, so batches in flight in the training pipeline are not disturbed."""
        correct = np.zeros(2)  # correct answers, examples: summed over the last stages of all replicas
        if (self.stage == 0 and x is None) or (self.last and y is None):
            raise ValueError("evaluate() needs x on stage 0 and y on the last stage")
        previous, following = self.grid.previous(self.engine.rank), self.grid.next(self.engine.rank)
        receive = Channel(self.engine, previous, PipelineTag.EVALUATION) if previous is not None else None
        send = Channel(self.engine, following, PipelineTag.EVALUATION) if following is not None else None
        with torch.no_grad():
            start = chunk = 0
            while True:
                chunk += 1
                if self.stage == 0:
                    inputs = x[start : start + batch_size]
                else:
                    inputs = torch.from_numpy(receive.recv(chunk))
                if len(inputs) == 0:
                    if send is not None:
                        send.send(inputs.numpy(), chunk)
                    break
                output = self.module(inputs)
                if send is not None:
                    send.send(np.ascontiguousarray(output.numpy()), chunk)
                else:
                    correct += [float((output.argmax(1) == y[start : start + len(inputs)]).sum()), len(inputs)]
                start += len(inputs)
        for channel in (receive, send):  # everything was received: the empty chunk ended the stream
            if channel is not None:
                channel.close()
        self.engine.allreduce(correct)
        return float(correct[0] / correct[1])

    def _tick(self, x: torch.Tensor | None, schedule: Schedule | None = None) -> float | None:
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

    def _forward(self, batch: int, x: torch.Tensor | None) -> None:
        inputs = x if self.stage == 0 else torch.from_numpy(self._from_previous.recv(batch))
        if self.stage > 0:
            inputs.requires_grad_(True)
        stash = {name: p.detach().clone().requires_grad_(p.requires_grad) for name, p in self.module.named_parameters()}
        output = torch.func.functional_call(self.module, stash, (inputs,))  # the graph holds this tick's weights
        self._stash.append((batch, inputs, output, stash))
        if self._to_next is not None:
            self._to_next.send(output.detach().numpy(), batch)

    def _backward(self, batch: int) -> float | None:
        stashed, inputs, output, weights = self._stash.popleft()
        assert stashed == batch, f"stage {self.stage} backpropagates batch {batch} but its oldest stash is {stashed}"
        loss = None
        if self.last:
            labelled, y = self._labels.popleft()
            assert labelled == batch
            value = self.loss_fn(output, y)
            value.backward()
            loss = float(value.detach())
        else:
            output.backward(torch.from_numpy(self._from_next.recv(batch)))
        if self._to_previous is not None:
            self._to_previous.send(np.ascontiguousarray(inputs.grad.numpy()), batch)
        with torch.no_grad():
            for name, param in self.module.named_parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = weights[name].grad.clone()
                elif param.requires_grad:
                    param.grad.copy_(weights[name].grad)  # the flat gradient buffer FAST's strategy reads
        self.optimizer.step()  # the replicas' strategy runs around it
        return loss


def _bounds(layers: list[torch.nn.Module], stages: int, split: str | Sequence[int] | torch.Tensor) -> list[int]:
    if isinstance(split, torch.Tensor):
        return balanced_split(_layer_seconds(layers, split), stages)
    if isinstance(split, str):
        if split != "parameters":
            raise ValueError(
                f"split={split!r}: give 'parameters', a sample batch (a tensor) to time the layers on, or the stages' "
                "layer boundaries [0, ..., n]"
            )
        costs = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in layers]
        return balanced_split(costs, stages)
    bounds = [int(b) for b in split]
    if len(bounds) != stages + 1 or bounds[0] != 0 or bounds[-1] != len(layers) or bounds != sorted(set(bounds)):
        raise ValueError(f"split={list(split)} must rise from 0 to {len(layers)} in {stages + 1} distinct boundaries")
    return bounds


def _layer_seconds(layers: list[torch.nn.Module], sample: torch.Tensor, repeats: int = 5) -> list[float]:
    """Each layer's forward and backward time on ``sample`` passed through the layers before it (median)."""
    seconds = []
    inputs = sample
    for layer in layers:
        given = inputs.detach().requires_grad_(inputs.is_floating_point())
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            output = layer(given)
            output.float().square().mean().backward()
            times.append(time.perf_counter() - begin)
        layer.zero_grad(set_to_none=True)
        seconds.append(sorted(times)[repeats // 2])
        inputs = output
    return seconds
