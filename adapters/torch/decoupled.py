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
from fast_core.pipeline.partition import balanced_split
from fast_core.pipeline.stage import DecoupledStage, split_bounds
from fast_core.runtime.process import init as default_engine

from .optimizer import DistributedOptimizer


class DecoupledTrainer(DecoupledStage):
    """This rank's stage of a K x D grid: its layers, optimizer, channels to the neighbouring stages, and its
    replicas' FAST strategy (the schedule: ``fast_core.pipeline.stage``).

    ``window``: at most that many batches in flight, which bounds each stage's gradient to ``window - 1`` updates
    old (``fast_core.pipeline.schedule``); None runs the full pipeline. ``split``: "parameters" balances the
    stages' parameter counts, a sample batch (a tensor) their forward and backward time measured on it (rank 0's
    measurement for all), or give the K + 1 layer boundaries. Every rank builds the whole model the same way (the
    same seed) and keeps its stage's layers; a stage's replicas start from their group's rank 0.
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
        super().__init__(engine or default_engine(), stages, window)
        bounds = self._agree(_bounds(layers, stages, split))
        self.module = torch.nn.Sequential(*layers[bounds[self.stage] : bounds[self.stage + 1]])
        self.loss_fn = loss_fn
        group = self._join_replicas()
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            raise ValueError(
                f"stage {self.stage} (layers {bounds[self.stage]}..{bounds[self.stage + 1]}) "
                "has no trainable parameter: give other split boundaries"
            )
        self.optimizer = DistributedOptimizer(optimizer(params), self.module, strategy, engine=group)
        self._stash: deque[tuple[int, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = deque()
        """(batch, input, output with its graph, the weights that graph holds) of each batch in flight"""

    def _close_replicas(self) -> None:
        self.optimizer.fast_worker.close()

    def _predict(self, inputs: torch.Tensor | np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return np.ascontiguousarray(self.module(torch.as_tensor(inputs)).numpy())

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
            value = self.loss_fn(output, self._labels_of(batch))
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
    costs = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in layers]
    return split_bounds(split, costs, stages)


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
