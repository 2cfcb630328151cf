"""Synchronous pipeline parallelism (GPipe's schedule): the baseline a user would otherwise pick against
``DecoupledTrainer``. Each step splits the batch into micro-batches, forwards them all through the K stages,
backpropagates them all, and updates every stage once with the whole batch's gradient: no delay, the gradient of
plain training, and a bubble of idle stages at the start and end of every step (a fraction (K - 1) / (M + K - 1)
of a step with M micro-batches)."""

from __future__ import annotations

import numpy as np

import torch

from .decoupled import DecoupledTrainer


class SynchronousPipelineTrainer(DecoupledTrainer):
    """``DecoupledTrainer``'s stages, channels, replicas and ``evaluate``, trained by GPipe's synchronous schedule
    with ``micro_batches`` micro-batches per step (``step`` returns the batch's loss on the last stage)."""

    def __init__(self, *args, micro_batches: int = 4, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        self.micro_batches = micro_batches

    def step(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> float | None:
        if self.stage == 0 and x is None:
            raise ValueError("stage 0 reads the data: pass the batch's inputs x to step()")
        if self.last and y is None:
            raise ValueError("the last stage computes the loss: pass the batch's targets y to step()")
        first = self.tick * self.micro_batches  # each micro-batch's number on the channels
        inputs = x.chunk(self.micro_batches) if self.stage == 0 else None
        targets = y.chunk(self.micro_batches) if self.last else None
        kept = []
        for m in range(self.micro_batches):
            given = inputs[m] if self.stage == 0 else torch.from_numpy(self._from_previous.recv(first + m))
            given.requires_grad_(self.stage > 0)
            output = self.module(given)
            kept.append((given, output))
            if self._to_next is not None:
                self._to_next.send(output.detach().numpy(), first + m)
        loss = 0.0
        for m in reversed(range(self.micro_batches)):
            given, output = kept[m]
            if self.last:
                value = self.loss_fn(output, targets[m]) * (len(targets[m]) / len(y))
                value.backward()
                loss += float(value.detach())
            else:
                output.backward(torch.from_numpy(self._from_next.recv(first + m)))
            if self._to_previous is not None:
                self._to_previous.send(np.ascontiguousarray(given.grad.numpy()), first + m)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        self.tick += 1
        self.batches += 1
        return loss if self.last else None

    def finish(self) -> list[float]:
        """Nothing is in flight between steps; closes the replicas' worker."""
        self.close()
        return []
