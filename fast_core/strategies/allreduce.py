"""All-reduce SGD, the baseline Horovod and DDP implement: every worker applies the mean gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..integrity import check_own
from .base import Strategy

if TYPE_CHECKING:
    from .base import StepContext


class AllReduce(Strategy):
    """x_i <- x_i - eta * (1/N) sum_j g_j: gradients averaged before the optimizer step, workers stay identical."""

    name = "allreduce"
    uses_gradients = True

    def before_step(self, ctx: StepContext) -> None:
        grads = ctx.model.grads()
        check_own(ctx, grads, "gradients", every=1)  # an all-reduce cannot refuse one rank's NaN: stop it here
        ctx.engine.allreduce(grads, kind="gradients")  # never matches another rank's average_params
        grads *= 1.0 / ctx.size
        ctx.model.set_grads(grads)
