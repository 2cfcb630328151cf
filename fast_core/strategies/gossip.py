"""Gossiping SGD (Jin et al. 2016): after its local step a worker averages with one uniformly random rank.

pull: worker i picks j among all N ranks (itself included: then nothing changes) and sets x_i <- (x_i + x_j) / 2.
push: worker i sends x_i to a random j (itself: nothing is sent); each worker then takes the count-normalised
      average of its own x_i and every x that arrived: x_i <- (x_i + sum received) / (1 + number received).
Both keep the mean of the workers in expectation only (a worker's value may be counted more than once).

``Gossip(...)`` builds one of two classes (as ``pathlib.Path`` builds a ``PosixPath``). ``SyncGossip`` (here, the
default): every rank draws the whole step's choice vector from one generator seeded by (seed, step), so each knows
whom it sends to and whom it hears from, and x_j is j's value after j's own step. ``AsyncGossip``
(gossip_async.py, ``synchronous=False``): one random peer per step, and the trainer never waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import ParameterWire, parameter_codec
from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import ChoosesVariant, check_variant
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext

VARIANTS = ("pull", "push")


def peer_choices(seed: int, step: int, size: int) -> np.ndarray:
    """c[i] is the rank worker i gossips with at ``step``: uniform over all ``size`` ranks, itself included.

    Every rank computes the same vector, which is what lets the synchronous variants post exactly the right
    sends and receives without asking anyone.
    """
    return np.random.default_rng((seed, step)).integers(0, size, size=size)


def average_into(params: np.ndarray, others: list[np.ndarray], refusals: int = 0) -> None:
    """params <- (params + sum(others)) / (1 + len(others)), in place: both variants' one mixing rule. ``refusals``
    messages were refused (NaN/Inf): their weights stay with the worker, as if each had sent its own params."""
    if refusals:
        params *= 1.0 + refusals
    for x in others:
        axpy(1.0, x, params)
    params *= 1.0 / (1 + refusals + len(others))


@registered
class Gossip(Strategy, ChoosesVariant):
    """Pull- or push-gossip with one uniformly random rank per step, synchronous (seeded) or asynchronous.

    What both variants share: the options and their checks, the mixing rule, the repr. ``synchronous=None`` means
    the class's own mode: synchronous for ``Gossip``.
    ``compress`` ("fp16", "bf16", "int8"; ``fast_core.compression``): the codec the parameters travel in, in both
    variants (the asynchronous boxes' slots carry its bytes); a worker averages its own exact values with the
    decoded ones it receives.
    """

    name = "gossip"
    bare_option = "variant"  # "gossip:push" in a strategy string
    synchronous = True  # the family's default; each variant declares its own

    def __new__(
        cls, variant: str = "pull", synchronous: bool | None = None, seed: int = 0, compress: str | None = "none"
    ) -> Gossip:
        return super().__new__(cls._variant(synchronous))

    def __init__(
        self, variant: str = "pull", synchronous: bool | None = None, seed: int = 0, compress: str | None = "none"
    ) -> None:
        check_variant(self, synchronous)
        if variant not in VARIANTS:
            raise ConfigError(f"gossip variant must be 'pull' or 'push', got {variant!r}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"gossip seed must be an integer >= 0 (all ranks must give the same), got {seed!r}")
        self.variant = variant
        self.seed = int(seed)
        self.compress = "none" if compress is None else str(compress)
        self._codec = parameter_codec(compress, "gossip")

    def cost_profile(self, size: int) -> CostProfile:
        """One model to or from one peer per step, waited for."""
        return CostProfile(rounds=1, models_per_round=1)

    def __repr__(self) -> str:
        return (
            f"Gossip(variant={self.variant!r}, synchronous={self.synchronous!r}, seed={self.seed!r}, "
            f"compress={self.compress!r})"
        )


class SyncGossip(Gossip):
    """Every rank knows the step's whole choice vector, so it posts exactly its sends and receives and waits."""

    lockstep = True
    synchronous = True

    def setup(self, ctx: StepContext) -> None:
        self._send = ctx.layout.empty()
        self._wire = ParameterWire(self._codec)
        self._pool: list[np.ndarray] = []  # receive buffers, grown to the most arrivals seen in one step

    def _receive_buffers(self, ctx: StepContext, count: int) -> list[np.ndarray]:
        while len(self._pool) < count:
            self._pool.append(ctx.layout.empty())
        return self._pool[:count]

    def after_step(self, ctx: StepContext) -> None:
        if ctx.size == 1:
            return
        params = ctx.model.params()
        check_own(ctx, params)
        rank = ctx.rank
        choice = peer_choices(self.seed, ctx.step, ctx.size)
        target = int(choice[rank])
        chosen_by = [int(k) for k in np.flatnonzero(choice == rank) if k != rank]
        partner = [target] if target != rank else []
        # pull: hear from the partner, answer those who chose us; push: the other way round
        sources, dests = (partner, chosen_by) if self.variant == "pull" else (chosen_by, partner)
        if not sources and not dests:
            return
        if dests:
            np.copyto(self._send, params)
        recvs = self._receive_buffers(ctx, len(sources))
        self._wire.exchange_and_wait(ctx.engine, self._send, dests, recvs, sources, Tag.GOSSIP)
        if recvs:
            kept = [buf for peer, buf in zip(sources, recvs, strict=True) if not refused(ctx, peer, buf)]
            average_into(params, kept, refusals=len(recvs) - len(kept))
            ctx.model.set_params(params)
