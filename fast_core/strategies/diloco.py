"""DiLoCo (Douillard et al. 2023): local SGD with an outer optimizer, and its streaming and decentralized forms.

Every worker keeps the outer parameters theta (equal on all workers) and an outer momentum v. The user's optimizer
takes ``period`` inner steps from theta; then the pseudo-gradient delta_i = theta - x_i is averaged over the
workers (one all-reduce of the parameters' size) and the outer optimizer, SGD with Nesterov momentum, moves theta:

    v <- mu v + delta;   theta <- theta - outer_lr (delta + mu v)      (nesterov=false: theta - outer_lr v)

and every worker starts its next inner steps from the new theta. ``outer_lr=1, momentum=0`` is local SGD.

Streaming DiLoCo (Douillard et al. 2025), ``fragments=F``: the flat parameter vector is cut into F contiguous
fragments (``np.array_split``); fragment f has its outer step after every step k with (k + 1 + f*H//F) % H == 0,
so each exchange carries 1/F of the model and the peak bandwidth drops F-fold; the other fragments go on with
their inner steps. ``overlap=tau`` (the paper's overlap, all-reduce form only): the fragment's pseudo-gradient is
taken after step t and its all-reduce only started (``Engine.iallreduce``); training goes on, and after step
t + tau the worker waits for it, moves theta by the outer step and merges it into the fragment's parameters as they
are then: x <- alpha x + (1 - alpha) theta (``alpha=0``: x takes theta, the inner steps since t are dropped).
tau < H // F keeps one exchange in flight at a time; ``close`` and ``reset`` complete the one pending.

Decentralized DiLoCo, ``topology=ring`` (``diloco:ring``): the average of the x_j is one gossip round instead, one
exchange of the parameters' size with the neighbours (``NeighbourMix``, as gradient tracking uses), and each worker
keeps its own theta_i and v_i. Its pseudo-gradient is theta_i - sum_j w_ij x_j = sum_j w_ij (theta_i - x_j): the
neighbours' pseudo-gradients taken against this worker's own theta. Mixing the pseudo-gradients theta_j - x_j
themselves would leave the thetas' disagreement where it is: nothing pulls theta_i toward its neighbours' (NoLoCo,
Kolehmainen et al. 2025, adds such a term for that reason), and on the core's 4-rank test task their consensus
distance after 150 steps was 960 against 0.024 with this rule. With ``outer_lr=1, momentum=0`` it is gossip local
SGD: x_i <- sum_j w_ij x_j every ``period`` steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fast_core.errors import ConfigError
from fast_core.model.mixing import axpy
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import check_flag, check_steps
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own
from fast_core.strategies.neighbours import NeighbourMix
from fast_core.strategies.registry import registered
from fast_core.topology import Topology, make_topology
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.engine import Request
    from fast_core.strategies.base import GroupChange, StepContext

EXAMPLE = "diloco:period=100,outer_lr=0.7,momentum=0.9,nesterov=true"


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@registered
class DiLoCo(Strategy):
    """Inner steps by the user's optimizer, outer Nesterov steps on the averaged (or gossiped) pseudo-gradient.

    ``period`` H: inner steps between two outer steps of a fragment. ``outer_lr``, ``momentum``, ``nesterov``: the
    outer optimizer (the paper's 0.7, 0.9, Nesterov). ``fragments``: streaming DiLoCo's F (1 to H). ``topology``:
    None for the all-reduce average, else a topology name or object for decentralized DiLoCo (a time-varying one is
    indexed by the count of outer exchanges); ``weights`` its mixing-weight rule.

    The period defaults to 100 (the paper's 500 inner steps are for language models trained for days). With few inner
    steps the outer momentum 0.9 can overshoot: on the torch example (inner SGD with momentum 0.9, 4 ranks, 15
    epochs) ``period=4`` reached 0.35 test accuracy against all-reduce's 0.994, ``period=16`` 0.986 and
    ``period=4,momentum=0.5`` 0.994; lower the momentum or lengthen the period.

    ``overlap`` tau: steps an outer exchange runs under the inner steps (0: none, it blocks); ``alpha``: the share
    of the local parameters kept when its result is merged (Streaming DiLoCo's 0.5).
    """

    name = "diloco"
    needs_equal_start = True  # each rank's outer parameters start at its own start: they would never meet

    def __init__(
        self,
        topology: str | Topology | None = None,
        period: int = 100,
        outer_lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
        fragments: int = 1,
        weights: str = "uniform",
        overlap: int = 0,
        alpha: float = 0.5,
    ) -> None:
        self.topology = topology
        self.period = check_steps(period, "diloco's period", "diloco:period=100 has an outer step every 100 steps")
        if not _number(outer_lr) or not 0 < outer_lr < float("inf"):
            raise ConfigError(f"diloco's outer_lr must be a number > 0, got {outer_lr!r}; e.g. {EXAMPLE}")
        if not _number(momentum) or not 0 <= momentum < 1:
            raise ConfigError(f"diloco's momentum (the outer one) must be in [0, 1), got {momentum!r}; e.g. {EXAMPLE}")
        self.outer_lr, self.momentum = float(outer_lr), float(momentum)
        try:
            self.nesterov = check_flag(nesterov, "diloco's nesterov")
        except ConfigError as exc:
            raise ConfigError(f"{exc}; e.g. diloco:period=100,nesterov=false") from None
        if isinstance(fragments, bool) or not isinstance(fragments, int) or not 1 <= fragments <= self.period:
            raise ConfigError(
                f"diloco's fragments must be a whole number from 1 to the period ({self.period}), got {fragments!r}; "
                f"e.g. diloco:period={self.period},fragments={min(4, self.period)} (each exchange then carries 1/"
                f"{min(4, self.period)} of the model)"
            )
        self.fragments = fragments
        if topology is None and weights != "uniform":
            raise ConfigError(
                f"diloco's weights={weights!r} mixes over a topology, and none is given; e.g. diloco:ring,weights="
                f"{weights} (decentralized DiLoCo), or leave weights out for the all-reduce average"
            )
        self.weights = weights
        self.overlap, self.alpha = self._check_overlap(overlap, alpha)

    def cost_profile(self, size: int) -> CostProfile:
        """One all-reduce of the model every ``period`` steps (fragments and overlap are not modelled)."""
        return CostProfile(allreduce=True, period=self.period)

    def _check_overlap(self, overlap: object, alpha: object) -> tuple[int, float]:
        gap = self.period // self.fragments
        example = f"diloco:period={max(self.period, 2 * self.fragments)},fragments={self.fragments},overlap=1"
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < max(gap, 1):
            fits = f"from 1 to {gap - 1}" if gap > 1 else "none here: it needs period // fragments >= 2"
            raise ConfigError(
                f"diloco's overlap must be 0 (off) or a whole number of steps below period // fragments ({gap}), so "
                f"one exchange is done before the next fragment's starts ({fits}), got {overlap!r}; e.g. {example}"
            )
        if not _number(alpha) or not 0 <= alpha < 1:
            raise ConfigError(
                f"diloco's alpha (the share of the local parameters kept at the merge) must be in [0, 1), got "
                f"{alpha!r}; e.g. {example},alpha=0.5"
            )
        if overlap and self.topology is not None:
            raise ConfigError(
                f"diloco's overlap={overlap} needs the all-reduce form: decentralized DiLoCo's gossip round "
                f"(diloco:{self.topology}) is a neighbour exchange waited within the step, not a nonblocking "
                f"all-reduce; drop the topology (e.g. {example}) or the overlap"
            )
        if not overlap and alpha != 0.5:
            raise ConfigError(
                f"diloco's alpha={alpha!r} merges an overlapped exchange, and overlap is 0; e.g. {example},"
                f"alpha={alpha}, or leave alpha out"
            )
        return overlap, float(alpha)

    # schedule ------------------------------------------------------------------------------------------------------
    def _fragment_due(self, step: int) -> int | None:
        """The fragment whose outer step comes after optimizer step ``step``, if any."""
        return self._by_offset.get((-(step + 1)) % self.period)

    def _outer_round(self, step: int) -> int:
        """How many outer exchanges (all fragments) happened before the one at ``step``: a time-varying topology's
        index, derived from the step so every rank, a replacement included, agrees without counting."""
        return sum((step + 1 + offset) // self.period for offset in self._by_offset) - 1

    # setup ---------------------------------------------------------------------------------------------------------
    def _prepare(self, ctx: StepContext) -> None:
        """What depends only on the group and the layout: the fragments, scratch space and the mixing."""
        size = ctx.layout.size
        if self.fragments > size:
            raise ConfigError(
                f"diloco's fragments={self.fragments} exceeds the model's {size} parameters; use fragments<={size}"
            )
        cuts = np.cumsum([0] + [len(part) for part in np.array_split(np.empty(size), self.fragments)])
        self._bounds = [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        self._by_offset = {f * self.period // self.fragments: f for f in range(self.fragments)}
        self._delta = ctx.layout.empty()  # new after a loss: an abandoned exchange may still write into the old one
        self._pending = None
        self._mix: NeighbourMix | None = None
        if self.topology is not None:
            self._graph = make_topology(self.topology, ctx.size, weights=self.weights)
            self._mix = NeighbourMix(self._graph)

    def setup(self, ctx: StepContext) -> None:
        self._prepare(ctx)
        self.reset(ctx)

    def reset(self, ctx: StepContext) -> None:
        """New parameters (a checkpoint, or the start): theta restarts from them, the outer momentum from zero. An
        exchange in flight is completed (every rank posted it) and its result dropped: it came from the old ones."""
        self._complete(ctx)
        self._pending: tuple[int, int, Request] | None = None
        self._theta = np.array(ctx.model.params(), copy=True)
        self._momentum = np.zeros_like(self._theta)

    # the outer step ------------------------------------------------------------------------------------------------
    def after_step(self, ctx: StepContext) -> None:
        fragment = self._fragment_due(ctx.step)
        if self._pending is not None and (ctx.step >= self._pending[1] or fragment is not None):
            self._merge(ctx)  # due; or a next one is (steps skipped, as after a resume): never two in flight
        if fragment is None:
            return
        params = ctx.model.params()
        check_own(ctx, params, every=1)  # an all-reduce cannot refuse one rank's NaN: stop it here
        lo, hi = self._bounds[fragment]
        theta, delta = self._theta[lo:hi], self._delta[lo:hi]
        if self._mix is None:
            np.subtract(theta, params[lo:hi], out=delta)
            if self.overlap:  # trains on; after step + overlap, _merge waits for it
                request = ctx.engine.iallreduce(delta, kind="parameters")
                self._pending = (fragment, ctx.step + self.overlap, request)
                return
            ctx.engine.allreduce(delta, kind="parameters")
            delta *= 1.0 / ctx.size
        else:  # sum_j w_ij (theta_i - x_j): the neighbours' pseudo-gradients taken against this worker's theta
            np.copyto(delta, params[lo:hi])
            self._mix(ctx, delta, self._outer_round(ctx.step), "parameters", Tag.PSEUDO_GRADIENTS)
            np.subtract(theta, delta, out=delta)
        self._outer_step(fragment)
        np.copyto(params[lo:hi], theta)
        ctx.model.set_params(params)

    def _outer_step(self, fragment: int) -> None:
        """theta and v of ``fragment`` moved by its averaged pseudo-gradient (in ``self._delta``)."""
        lo, hi = self._bounds[fragment]
        theta, velocity, delta = self._theta[lo:hi], self._momentum[lo:hi], self._delta[lo:hi]
        velocity *= self.momentum
        velocity += delta
        if self.nesterov:
            axpy(-self.outer_lr, delta, theta)
            axpy(-self.outer_lr * self.momentum, velocity, theta)
        else:
            axpy(-self.outer_lr, velocity, theta)

    def _merge(self, ctx: StepContext) -> None:
        """Overlap: wait for the pending exchange, take the outer step, and merge theta into the parameters as they
        are now: x <- alpha x + (1 - alpha) theta."""
        fragment, _, request = self._pending
        ctx.engine.wait(request)
        self._pending = None
        lo, hi = self._bounds[fragment]
        self._delta[lo:hi] *= 1.0 / ctx.size
        self._outer_step(fragment)
        params = ctx.model.params()
        part = params[lo:hi]
        part *= self.alpha
        axpy(1.0 - self.alpha, self._theta[lo:hi], part)
        ctx.model.set_params(params)

    def _complete(self, ctx: StepContext) -> None:
        """Wait for an exchange in flight, dropping its result (every rank posted it: all complete it alike)."""
        pending = getattr(self, "_pending", None)
        if pending is not None:
            ctx.engine.wait(pending[2])
            self._pending = None

    def close(self, ctx: StepContext) -> None:
        """The exchange in flight (overlap) is completed and merged, as it would have been ``overlap`` steps on."""
        if getattr(self, "_pending", None) is not None:
            self._merge(ctx)

    def abandon(self, ctx: StepContext) -> None:
        """A rank was lost: the exchange in flight is dropped on every survivor (its group is revoked; ``rejoin``
        gives all the lowest member's theta, so those that merged it and those that did not agree again)."""
        self._pending = None

    # a lost rank ---------------------------------------------------------------------------------------------------
    def rejoin(self, ctx: StepContext, change: GroupChange) -> None:
        """The survivors keep their theta and outer momentum (the Worker averaged their inner parameters); with the
        all-reduce average every rank takes the lowest member's, so a loss in the middle of an outer step (some
        ranks done with it, some not) cannot leave them apart. A replacement takes the lowest member's too."""
        self.heal_topology(change)
        member = getattr(self, "_theta", None) is not None
        self._prepare(ctx)
        if not member:
            self.reset(ctx)
        if self._mix is not None and not change.newcomers:
            return  # decentralized: each survivor's own theta and momentum go on
        root = np.array([ctx.rank if member else ctx.size], dtype=np.int64)
        ctx.engine.allreduce(root, op="min", kind="job")
        take = self._mix is None or not member
        for state in (self._theta, self._momentum):
            buffer = state if take or ctx.rank == int(root[0]) else np.empty_like(state)
            ctx.engine.broadcast(buffer, int(root[0]), kind="job")
