"""All-reduce SGD, the baseline Horovod and DDP implement: every worker applies the mean gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fast_core.compression import parameter_codec
from fast_core.compression.ring import ring_allreduce
from fast_core.strategies.base import Strategy
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own
from fast_core.strategies.registry import registered
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@registered
class AllReduce(Strategy):
    """x_i <- x_i - eta * (1/N) sum_j g_j: gradients averaged before the optimizer step, workers stay identical.

    ``compress``: "fp16", "bf16" or "int8" sums the gradients in a ring of point-to-point messages through that
    codec (``fast_core.compression.ring``: 2 (N - 1) / N of the gradient in the codec's bytes, as Horovod's
    ``Compression.fp16``); "none" (the default) is the MPI library's own all-reduce.
    """

    name = "allreduce"
    uses_gradients = True

    def __init__(self, compress: str | None = "none") -> None:
        self.compress = "none" if compress is None else str(compress)
        self._codec = parameter_codec(compress, "allreduce")

    def cost_profile(self, size: int) -> CostProfile:
        """One all-reduce of the gradients, waited for after the step's compute."""
        return CostProfile(allreduce=True)

    def __repr__(self) -> str:
        return "AllReduce()" if self._codec is None else f"AllReduce(compress={self.compress!r})"

    def before_step(self, ctx: StepContext) -> None:
        grads = ctx.model.grads()
        check_own(ctx, grads, "gradients", every=1)  # an all-reduce cannot refuse one rank's NaN: stop it here
        if self._codec is None:
            ctx.engine.allreduce(grads, kind="gradients")  # never matches another rank's average_params
        else:
            ring_allreduce(ctx.engine, grads, self._codec, Tag.RING)
        grads *= 1.0 / ctx.size
        ctx.model.set_grads(grads)
