"""All-reduce SGD, the baseline Horovod and DDP implement: every worker applies the mean gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Strategy

if TYPE_CHECKING:
    from ..worker import Worker


class AllReduce(Strategy):
    """x_i <- x_i - eta * (1/N) sum_j g_j: gradients averaged before the optimizer step, workers stay identical."""

    name = "allreduce"

    def before_step(self, worker: Worker) -> None:
        grads = worker.model.grads()
        worker.allreduce(grads)
        grads *= 1.0 / worker.size
        worker.model.set_grads(grads)
