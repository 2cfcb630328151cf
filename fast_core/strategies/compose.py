"""Composition instead of flags: run a strategy only every k steps, or one strategy after another.

``Every(4, "dpsgd:ring")`` and ``Schedule([(100, "allreduce"), (None, "dpsgd:ring")])`` wrap any strategy, in
the spirit of optax's ``chain``: the pieces stay small and each algorithm is still written once.

Time index. Wrapped strategies get a StepContext whose ``step`` is always the worker's global step, the same on
every rank; the wrappers only choose which steps reach the inner hooks. ``Every`` gives its inner strategy a child
context whose ``round`` counts only the steps it runs on, so round r (not step r) uses W(r) and a one-peer
exponential graph still cycles through all its peers (D-PSGD and SGP index their topology by round). After a
``Schedule`` switch at step s the new strategy's rounds are s, s+1, ... exactly as if it had run from 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fast_core.errors import ConfigError
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import check_steps
from fast_core.strategies.registry import composes
from fast_core.strategies.spec import StrategySpec

if TYPE_CHECKING:
    from fast_core.strategies.base import GroupChange, StepContext
    from fast_core.strategies.cost import CostProfile

Buildable = Strategy | StrategySpec | str
"""What a wrapper takes: a Strategy, or a spec or strategy string it builds."""


def _build(strategy: Buildable) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    spec = strategy if isinstance(strategy, StrategySpec) else StrategySpec.parse(strategy)
    return spec.build()


class Every(Strategy):
    """Run ``inner``'s step hooks only on steps k with (k + 1) % every == 0; setup, end_epoch and close always.

    With D-PSGD this is gossip every k steps that still overlaps communication: the exchange posted after a
    mixing step completes during the k local steps that follow, and the next mixing step computes
    x <- sum_j w_ij x_j^sent + (x_now - x_sent), keeping every optimizer update made in between.
    """

    name = "every"

    def __init__(self, k: int, inner: Buildable) -> None:
        self.k = check_steps(k, "every", "dpsgd:ring,every=4 mixes on every 4th step")
        self.inner = _build(inner)

    @property
    def lockstep(self) -> bool:
        return self.inner.lockstep

    def lockstep_steps(self) -> float:
        return self.inner.lockstep_steps()  # the inner strategy follows the same steps

    @property
    def uses_gradients(self) -> bool:
        return self.inner.uses_gradients

    def cost_profile(self, size: int) -> CostProfile | None:
        """The inner strategy's exchange, made on one step in k."""
        inner = self.inner.cost_profile(size)
        return None if inner is None else inner.every(self.k)

    def _due(self, ctx: StepContext) -> bool:
        return (ctx.step + 1) % self.k == 0

    def setup(self, ctx: StepContext) -> None:
        self._inner_ctx = ctx.child()  # the inner strategy's rounds count its own mixing steps only
        self.inner.setup(self._inner_ctx)

    def before_step(self, ctx: StepContext) -> None:
        if self._due(ctx):
            self.inner.before_step(self._inner_ctx)

    def after_step(self, ctx: StepContext) -> None:
        if self._due(ctx):
            self.inner.after_step(self._inner_ctx)
            self._inner_ctx.round += 1

    def end_epoch(self, ctx: StepContext, metric: float) -> None:
        self.inner.end_epoch(self._inner_ctx, metric)

    def close(self, ctx: StepContext) -> None:
        self.inner.close(self._inner_ctx)

    def reset(self, ctx: StepContext) -> None:
        self.inner.reset(self._inner_ctx)

    def abandon(self, ctx: StepContext) -> None:
        self.inner.abandon(self._inner_ctx)

    def rejoin(self, ctx: StepContext, change: GroupChange) -> None:
        if not hasattr(self, "_inner_ctx"):  # a replacement joining: never set up
            self._inner_ctx = ctx.child()
        self.inner.rejoin(self._inner_ctx, change)  # its context keeps counting its rounds

    def heal_topology(self, change: GroupChange) -> None:
        self.inner.heal_topology(change)

    @property
    def survivable(self) -> bool:
        return self.inner.survivable

    @property
    def needs_equal_start(self) -> bool:
        return self.inner.needs_equal_start


Phase = tuple[int | None, Buildable]


class Schedule(Strategy):
    """One strategy for its number of steps, then the next; ``None`` steps (last phase only) runs to the end.

    Steps are counted from the step the schedule was set up at (0 in a plain run), so schedules nest. Every
    rank switches at the same step: at the first hook of the switch step (before_step, or after_step when an
    adapter only calls that), the old strategy's ``close`` completes its pending communication and the new
    one's ``setup`` runs with ``ctx.step`` equal to the switch step and the parameters that step started
    from.
    """

    name = "schedule"

    def __init__(self, phases: Sequence[Phase]) -> None:
        example = "Schedule([(100, 'allreduce'), (None, 'dpsgd:ring')])"
        phases = list(phases)
        if not phases:
            raise ConfigError(f"Schedule needs at least one phase, e.g. {example}")
        checked: list[tuple[int | None, Strategy]] = []
        for index, phase in enumerate(phases):
            if not isinstance(phase, tuple) or len(phase) != 2:
                raise ConfigError(
                    f"Schedule phase {index} must be a (steps, strategy) pair, got {phase!r}; e.g. {example}"
                )
            steps, strategy = phase
            last = index == len(phases) - 1
            if last and steps is not None:
                raise ConfigError(
                    f"the last Schedule phase runs until training ends: give it None steps, e.g. {example}"
                )
            if not last:
                if steps is None:
                    raise ConfigError(
                        f"only the last Schedule phase may have None steps (phase {index} has); e.g. {example}"
                    )
                steps = check_steps(steps, f"Schedule phase {index}'s steps", example)
            checked.append((steps, _build(strategy)))
        self.phases = checked

    def _phase_at(self, step: int) -> int:
        """Index of the phase that owns ``step`` (counted from the schedule's start)."""
        end = 0
        for index, (steps, _) in enumerate(self.phases):
            if steps is None:
                return index
            end += steps
            if step < end:
                return index
        raise AssertionError("unreachable: the last phase has None steps")

    def setup(self, ctx: StepContext) -> None:
        self._origin = ctx.step
        self._index, self._set_up = 0, False
        self.active.setup(ctx)
        self._set_up = True

    @property
    def lockstep(self) -> bool:
        return any(strategy.lockstep for _, strategy in self.phases)

    def lockstep_steps(self) -> float:
        """The steps of the leading lockstep phases (all-reduce warm-up, then asynchronous). A lockstep phase after
        an asynchronous one is refused: the ranks' step counts part there, so under a shared budget some would stop
        before the switch and the others wait for them at the lockstep phase."""
        steps = 0.0
        for index, (phase_steps, strategy) in enumerate(self.phases):
            inner = strategy.lockstep_steps()
            if inner < (math.inf if phase_steps is None else phase_steps):
                later = [s for _, s in self.phases[index + 1 :] if s.lockstep]
                if later:
                    raise ConfigError(
                        f"under a shared budget a Schedule's lockstep phases must come before its asynchronous "
                        f"ones: phase {index} ({strategy.name}) is asynchronous and a later one ({later[0].name}) "
                        "is lockstep, e.g. Schedule([(100, 'allreduce'), (None, 'async:ring')])"
                    )
                return steps + inner
            steps += phase_steps if phase_steps is not None else math.inf
        return steps

    @property
    def uses_gradients(self) -> bool:
        return any(strategy.uses_gradients for _, strategy in self.phases)

    def cost_profile(self, size: int) -> CostProfile | None:
        """The last phase's: the one that runs to the end (a warm-up is left out)."""
        return self.phases[-1][1].cost_profile(size)

    @property
    def active(self) -> Strategy:
        """The strategy that owns the current step."""
        return self.phases[self._index][1]

    def _advance(self, ctx: StepContext) -> None:
        index = self._phase_at(ctx.step - self._origin)
        if index != self._index:
            self.active.close(ctx)
            self._index, self._set_up = index, False
            self.active.setup(ctx)  # collective: a rank lost meanwhile raises PeerLost here, half set up
            self._set_up = True

    def before_step(self, ctx: StepContext) -> None:
        self._advance(ctx)
        self.active.before_step(ctx)

    def after_step(self, ctx: StepContext) -> None:
        self._advance(ctx)
        self.active.after_step(ctx)

    def end_epoch(self, ctx: StepContext, metric: float) -> None:
        self.active.end_epoch(ctx, metric)

    def close(self, ctx: StepContext) -> None:
        self.active.close(ctx)

    def reset(self, ctx: StepContext) -> None:
        self._advance(ctx)  # the phase of the checkpoint's step
        if self._set_up:
            self.active.reset(ctx)
        else:  # its setup was cut short by a lost rank: nothing of it to close, set it up over the new group
            self.active.setup(ctx)
            self._set_up = True

    def abandon(self, ctx: StepContext) -> None:
        if self._set_up:  # a phase whose setup a lost rank cut short has no threads to stop
            self.active.abandon(ctx)

    def rejoin(self, ctx: StepContext, change: GroupChange) -> None:
        if not hasattr(self, "_index"):  # a replacement joining: the group's schedule started at its first step
            self._origin = change.first_step
            self._index = self._phase_at(ctx.step - self._origin)
        for index, (_, strategy) in enumerate(self.phases):
            if index != self._index:  # later phases start on the healed topology too
                strategy.heal_topology(change)
        self.active.rejoin(ctx, change)  # set up again over the new group, whether its setup had finished or not
        self._set_up = True

    def heal_topology(self, change: GroupChange) -> None:
        for _, strategy in self.phases:
            strategy.heal_topology(change)

    @property
    def survivable(self) -> bool:
        return all(strategy.survivable for _, strategy in self.phases)

    @property
    def needs_equal_start(self) -> bool:
        return any(strategy.needs_equal_start for _, strategy in self.phases)


def warmup(steps: int, then: Buildable) -> Strategy:
    """All-reduce SGD for ``steps`` steps (workers stay identical while the loss falls fastest), then ``then``.

    ``steps=0`` returns ``then`` itself, so a sweep over warm-up lengths needs no special case.
    """
    steps = check_steps(steps, "warmup", "dpsgd:exp1,warmup=50 runs all-reduce for 50 steps first", minimum=0)
    if steps == 0:
        return _build(then)
    return Schedule([(steps, "allreduce"), (None, then)])


@composes("every")
def _every(strategy: Strategy, k: object) -> Strategy:
    return Every(k, strategy)  # type: ignore[arg-type]  # Every checks k


@composes("warmup")
def _warmup(strategy: Strategy, steps: object) -> Strategy:
    return warmup(steps, strategy)  # type: ignore[arg-type]  # warmup checks steps
