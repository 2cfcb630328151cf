"""FAST as published (Viviani 2019): gradients, not parameters, travel to the torus neighbours.

After its own step a worker sends its gradient to its neighbours and applies every neighbour gradient it has
received as one more step of its own (stateful) optimizer, unscaled. ``FAST(...)`` builds one of two classes
(as ``pathlib.Path`` builds a ``PosixPath``): ``AsyncFAST`` (the default, fast_async.py), where the trainer never
blocks, or ``SyncFAST`` (here, ``synchronous=True``), which exchanges the gradients of the same step and applies
them in rank order: deterministic, for tests and for comparing with the async run. Every ``restart_every`` epochs
(default 1, as published; ``Worker.end_epoch(metric)``) all workers restart from the replica with the best
validation metric, optionally with fresh optimizer state as the original did.

The restart is not optional in practice: no parameters are ever mixed, and since each worker applies more of its
neighbours' gradients than its own, differences between neighbours grow instead of shrinking. On a bipartite
graph (a torus with even sides, an even ring) the "checkerboard" difference d evolves as d <- (I + (deg - 1)
lr H) d for a loss with Hessian H: replicas drift apart exponentially between restarts. Measured on digits with
4 workers on a 2x2 torus: averaged-model accuracy 0.13-0.44 without restarts, where all-reduce reaches 0.92.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import ParameterWire, gradient_codec
from fast_core.engine import Request
from fast_core.engine.collectives import restart_from_best
from fast_core.errors import ConfigError
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import ChoosesVariant, check_variant, static_topology
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.topology import Topology
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


@registered
class FAST(Strategy, ChoosesVariant):
    """Nearest-neighbour gradient sharing on a torus; each neighbour gradient is one extra optimizer step.

    What both variants share: the options, the static neighbour sets, the best-replica restart at epoch ends.
    ``synchronous=None`` means the class's own mode: asynchronous for ``FAST``, as published.
    ``compress``: the codec the gradients travel in, any of ``fast_core.compression`` ("fp16", "bf16", "int8",
    "topk:ratio=R", "randomk:ratio=R"), with error feedback: what a message leaves out of a gradient is added to
    the sender's next one, so nothing is lost for good. The neighbours apply the decoded gradients.
    """

    name = "fast"
    uses_gradients = True
    synchronous = False  # the family's default; each variant declares its own

    def __new__(
        cls,
        topology: str | Topology = "torus",
        synchronous: bool | None = None,
        restart_every: int | None = 1,
        reset_optimizer: bool = False,
        compress: str | None = "none",
    ) -> FAST:
        return super().__new__(cls._variant(synchronous))

    def __init__(
        self,
        topology: str | Topology = "torus",
        synchronous: bool | None = None,
        restart_every: int | None = 1,
        reset_optimizer: bool = False,
        compress: str | None = "none",
    ) -> None:
        check_variant(self, synchronous)
        if restart_every is not None and restart_every < 1:
            raise ConfigError(f"restart_every must be >= 1 epochs (or None to never restart), got {restart_every}")
        self.topology = topology
        self.restart_every = restart_every
        self.reset_optimizer = reset_optimizer
        self.compress = "none" if compress is None else str(compress)  # a strategy string's none: None
        self._codec = gradient_codec(compress)

    def setup(self, ctx: StepContext) -> None:
        self._graph = static_topology(self.topology, ctx.size, "uniform", "FAST")
        self._sources = self._graph.in_neighbors(ctx.rank)
        self._dests = self._graph.out_neighbors(ctx.rank)
        self._epochs = 0

    def end_epoch(self, ctx: StepContext, metric: float) -> None:
        self._epochs += 1
        if self.restart_every and self._epochs % self.restart_every == 0:
            restart_from_best(ctx.model, ctx.engine, metric, reset_optimizer=self.reset_optimizer)

    def __repr__(self) -> str:
        return (
            f"FAST(topology={self.topology!r}, synchronous={self.synchronous!r}, "
            f"restart_every={self.restart_every!r}, reset_optimizer={self.reset_optimizer!r}, "
            f"compress={self.compress!r})"
        )


class SyncFAST(FAST):
    """The gradients of the same step, exchanged during the optimizer step and applied in rank order after it."""

    lockstep = True
    synchronous = True

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self._sent = ctx.layout.empty()
        self._received = [ctx.layout.empty() for _ in self._sources]
        self._wire = ParameterWire(self._codec, feedback=True)
        self._requests: list[Request] = []

    def before_step(self, ctx: StepContext) -> None:
        grads = ctx.model.grads()
        check_own(ctx, grads, "gradients", every=1)
        np.copyto(self._sent, grads)
        self._requests = self._wire.exchange(
            ctx.engine, self._sent, self._dests, self._received, self._sources, Tag.PARAMETERS, ctx.step
        )

    def after_step(self, ctx: StepContext) -> None:
        ctx.engine.wait_all(self._requests)
        self._wire.finish()
        for peer, gradient in zip(self._sources, self._received, strict=True):
            if not refused(ctx, peer, gradient, "gradients"):  # a NaN/Inf gradient is not applied
                ctx.model.apply_gradient(gradient)

    def close(self, ctx: StepContext) -> None:
        ctx.engine.wait_all(self._requests)
