"""Local SGD (periodic averaging): workers train alone and meet for one all-reduce of parameters every H steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import check_steps
from fast_core.strategies.compose import Every
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own
from fast_core.strategies.registry import registered

if TYPE_CHECKING:
    from fast_core.strategies.base import StepContext


class ParameterAverage(Strategy):
    """x_i <- (1/N) sum_j x_j after every step it runs on: one all-reduce of the parameters, workers identical."""

    name = "average"

    def cost_profile(self, size: int) -> CostProfile:
        """One all-reduce of the parameters (LocalSGD's ``Every`` spreads it over its period)."""
        return CostProfile(allreduce=True)

    def after_step(self, ctx: StepContext) -> None:
        params = ctx.model.params()
        check_own(ctx, params, every=1)  # an all-reduce cannot refuse one rank's NaN: stop it here
        ctx.engine.allreduce(params, kind="parameters")
        params *= 1.0 / ctx.size
        ctx.model.set_params(params)


@registered
class LocalSGD(Every):
    """``period`` local steps, then x_i <- (1/N) sum_j x_j, so communication drops ``period``-fold.

    It is ``Every(period, ParameterAverage())``: averaging happens after the optimizer step of every step k with
    (k + 1) % period == 0, k being the worker's global step; right after it every worker holds the same
    parameters. ``period=1`` is parameter averaging every step (equal to all-reduce SGD for plain SGD).
    """

    name = "localsgd"

    def __init__(self, period: int = 4) -> None:
        period = check_steps(period, "LocalSGD period", "localsgd:period=8 averages every 8 steps")
        super().__init__(period, ParameterAverage())

    @property
    def period(self) -> int:
        """Steps between two averages (``Every``'s ``k``)."""
        return self.k

    def __repr__(self) -> str:
        return f"LocalSGD(period={self.period})"
