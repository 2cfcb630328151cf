"""Elastic averaging SGD (Zhang et al. 2015): workers are pulled towards a centre variable held by one rank.

``EASGD(tau, alpha, center, synchronous)`` is ``Every(tau, elastic round)``: the period is the one "every k steps"
mechanism of compose.py, and the round is ``SyncEASGD`` (here) or ``AsyncEASGD`` (easgd_async.py). Both share
``ElasticRound``: the options, the rule and the centre's z; which role a rank plays is decided once, at setup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import ParameterWire, parameter_codec
from fast_core.engine.capabilities import world_ranks
from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import ChoosesVariant, check_flag, check_steps
from fast_core.strategies.compose import Every
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.transport.tags import Tag

log = logging.getLogger("fast")

if TYPE_CHECKING:
    from fast_core.strategies.base import GroupChange, StepContext

Talk = Callable[["StepContext", np.ndarray], None]
"""One rank's part of a round: move ``params`` (this worker's x, changed in place) and z."""


class ElasticRound(Strategy, ChoosesVariant):
    """On every step it runs: d = alpha (x_i - z); x_i <- x_i - d; z <- z + d, with z kept on rank ``center``.

    ``alpha`` defaults to 0.9 / N, the reference code's beta = N alpha = 0.9. Alone (one rank) nothing happens:
    the centre would only lag behind the worker, so it trains as plain SGD, as every strategy does on one rank.
    A variant says what the centre and the other ranks do (``_setup_centre``, ``_setup_member``).
    """

    name = "elastic"
    synchronous: bool

    def __init__(self, alpha: float | None = None, center: int = 0, compress: str | None = "none") -> None:
        if alpha is not None and not 0 < alpha < 1:
            raise ConfigError(f"alpha (the elastic moving rate) must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self.center = center
        self.compress = "none" if compress is None else str(compress)
        self._codec = parameter_codec(compress, "easgd")

    def cost_profile(self, size: int) -> CostProfile:
        """The centre's link takes the other size - 1 models in and sends as many out (EASGD's ``Every`` spreads
        that over tau steps)."""
        return CostProfile(rounds=2, models_per_round=size - 1)

    def setup(self, ctx: StepContext) -> None:
        if not 0 <= self.center < ctx.size:
            raise ConfigError(f"center rank {self.center} does not exist: ranks are 0..{ctx.size - 1}")
        self._alpha = self.alpha if self.alpha is not None else 0.9 / ctx.size
        self._wire = ParameterWire(self._codec)
        self._others = [r for r in range(ctx.size) if r != self.center]
        if ctx.rank == self.center:
            self._z: np.ndarray | None = np.array(ctx.model.params(), copy=True)
            self._talk = self._setup_centre(ctx)
        else:
            self._z = None
            self._talk = self._setup_member(ctx)

    def reset(self, ctx: StepContext) -> None:
        """Collective: requests in flight are answered (``close``), then the centre variable restarts from the
        parameters now in place (a loaded checkpoint's), not from the ones it had pulled toward."""
        self.close(ctx)
        self.setup(ctx)

    def rejoin(self, ctx: StepContext, change: GroupChange) -> None:
        """The centre stays with the rank launched as the centre if it is in the group (itself or its replacement),
        else moves to rank 0; z restarts from the parameters the Worker left (the survivors' average), and alpha
        follows the new size unless it was given."""
        launched = self.__dict__.setdefault("_launch_center", self.center)
        world = world_ranks(ctx.engine)
        self.center = world.index(launched) if launched in world else 0
        if ctx.rank == 0 and launched not in world:
            log.warning("EASGD: the centre's rank was lost; the centre moves to rank 0, from the survivors' average")
        self.setup(ctx)

    def _setup_centre(self, ctx: StepContext) -> Talk:
        raise NotImplementedError

    def _setup_member(self, ctx: StepContext) -> Talk:
        raise NotImplementedError

    def after_step(self, ctx: StepContext) -> None:
        if ctx.size == 1:
            return
        params = ctx.model.params()
        check_own(ctx, params)
        self._talk(ctx, params)
        ctx.model.set_params(params)

    def _pull(self, params: np.ndarray, z: np.ndarray) -> None:
        """x <- x - alpha (x - z), in place."""
        params *= 1.0 - self._alpha
        axpy(self._alpha, z, params)

    def center_params(self) -> np.ndarray | None:
        """The centre variable z (on the centre rank; None elsewhere): the model EASGD delivers."""
        return self._z


class SyncEASGD(ElasticRound):
    """All workers meet the centre at the same step: z moves by the sum of all d's (the reference's beta = N alpha)."""

    lockstep = True
    synchronous = True

    def _setup_centre(self, ctx: StepContext) -> Talk:
        self._z_sent = ctx.layout.empty()  # z of this round, sent to every worker
        self._received = [ctx.layout.empty() for _ in self._others]
        return self._centre_round

    def _setup_member(self, ctx: StepContext) -> Talk:
        self._x_sent = ctx.layout.empty()
        self._z_in = ctx.layout.empty()
        return self._member_round

    def _centre_round(self, ctx: StepContext, params: np.ndarray) -> None:
        z = self._z
        np.copyto(self._z_sent, z)
        others = self._others
        self._wire.exchange_and_wait(ctx.engine, self._z_sent, others, self._received, others, Tag.PARAMETERS)
        # z + alpha sum_j (x_j - z) over the members heard (a NaN/Inf x_j is refused: it does not move z)
        heard = [x for peer, x in zip(others, self._received, strict=True) if not refused(ctx, peer, x)]
        for x in (*heard, params):
            axpy(self._alpha, x, z)
        axpy(-self._alpha * (len(heard) + 1), self._z_sent, z)
        self._pull(params, self._z_sent)

    def _member_round(self, ctx: StepContext, params: np.ndarray) -> None:
        np.copyto(self._x_sent, params)
        centre = [self.center]
        self._wire.exchange_and_wait(ctx.engine, self._x_sent, centre, [self._z_in], centre, Tag.PARAMETERS)
        if not refused(ctx, self.center, self._z_in):  # a NaN/Inf centre is not followed
            self._pull(params, self._z_in)


@registered
class EASGD(Every):
    """Every ``tau`` steps: d = alpha (x_i - z); x_i <- x_i - d; z <- z + d, with z kept on rank ``center``.

    Synchronous: all workers meet the centre at the same step (z moves by the sum of all d's, i.e. the
    reference's beta = N alpha). Asynchronous: each worker talks to the centre on its own schedule; the centre
    rank's communication thread answers with the current z and applies that worker's d at once, so no worker
    waits for another. ``alpha`` defaults to 0.9 / N, the reference code's beta = 0.9.
    ``compress`` ("fp16", "bf16", "int8"): the codec both directions travel in, in both variants: the centre moves
    z with the workers' decoded x, the workers move towards the decoded z.
    """

    name = "easgd"

    def __init__(
        self,
        tau: int = 4,
        alpha: float | None = None,
        center: int = 0,
        synchronous: bool = True,
        compress: str | None = "none",
    ) -> None:
        tau = check_steps(tau, "EASGD tau (steps between talks with the centre)", "easgd:tau=4 talks every 4 steps")
        variant = ElasticRound._variant(check_flag(synchronous, "synchronous"))
        super().__init__(tau, variant(alpha, center, compress))

    @property
    def tau(self) -> int:
        """Steps between two talks with the centre (``Every``'s ``k``)."""
        return self.k

    @property
    def alpha(self) -> float | None:
        return self.inner.alpha

    @property
    def center(self) -> int:
        return self.inner.center

    @property
    def synchronous(self) -> bool:
        return self.inner.synchronous

    @property
    def compress(self) -> str:
        return self.inner.compress

    def center_params(self) -> np.ndarray | None:
        """The centre variable z (on the centre rank; None elsewhere): the model EASGD delivers."""
        return self.inner.center_params()

    def __repr__(self) -> str:
        r = self.inner
        return (
            f"EASGD(tau={self.tau}, alpha={r.alpha!r}, center={r.center!r}, synchronous={r.synchronous!r}, "
            f"compress={r.compress!r})"
        )
