"""The canonical text of a built strategy: what ``Worker.start`` compares across ranks (``check_same_setup``).

A strategy a string could have built is described as the StrategySpec of every option it holds, so its text is
``str(spec)``: "localsgd:period=4", "dpsgd:topology=ring,weights=uniform,compress=none,qgm=0.0,every=4". Other
compositions and strategies of one's own get a text of their own ("every(2,schedule(...))",
"module.Class:repr"), equal on two ranks exactly when they run the same algorithm with the same options.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import replace

from fast_core.grammar import spelled
from fast_core.strategies import registry
from fast_core.strategies.base import Strategy
from fast_core.strategies.compose import Every, Schedule
from fast_core.strategies.spec import StrategySpec

__all__ = ["canonical_strategy", "described"]


def canonical_strategy(strategy: Strategy, shared: bool = False) -> str:
    """``strategy`` as text with every option spelled out. For the built-in strategies with named topologies
    ``StrategySpec.parse`` reads it back; a Topology or graph object is shown with a digest of its edges and
    weights. ``shared=True`` leaves out the options each rank may choose for itself (``Strategy.rank_options``)."""
    spec = described(strategy, shared)
    if spec is not None:
        return str(spec)
    if isinstance(strategy, Schedule):
        phases = ";".join(f"{spelled(n)}:{canonical_strategy(s, shared)}" for n, s in strategy.phases)
        return f"schedule({phases})"
    if isinstance(strategy, Every):
        return f"every({strategy.k},{canonical_strategy(strategy.inner, shared)})"
    kind = type(strategy)
    return f"{kind.__module__}.{kind.__qualname__}:" + re.sub(r" at 0x[0-9a-fA-F]+", "", repr(strategy))


def described(strategy: Strategy, shared: bool = False) -> StrategySpec | None:
    """The spec that builds ``strategy`` with every option it holds, or None when no strategy string could:
    a registered strategy, wrapped by ``Every`` and then by a warm-up ``Schedule`` at most once each."""
    factory = registry.STRATEGIES.get(getattr(strategy, "name", ""))
    if isinstance(factory, type) and isinstance(strategy, factory):
        names = [p for p in inspect.signature(factory).parameters if p != "self"]
        if all(hasattr(strategy, p) for p in names):
            kept = [p for p in names if not (shared and p in strategy.rank_options)]
            return StrategySpec(strategy.name, tuple((p, getattr(strategy, p)) for p in kept))
    if isinstance(strategy, Every):
        inner = described(strategy.inner, shared)
        plain = inner is not None and inner.every is None and inner.warmup is None
        return replace(inner, every=strategy.k) if plain else None
    if isinstance(strategy, Schedule) and len(strategy.phases) == 2:
        (steps, first), (_, then) = strategy.phases
        inner = described(then, shared)
        warm = described(first) == StrategySpec.of("allreduce", {"compress": "none"})
        if warm and inner is not None and inner.warmup is None:  # what warmup=W builds
            return replace(inner, warmup=steps)
    return None
