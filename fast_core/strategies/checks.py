"""Checks several strategies share: whole numbers of steps, static topologies, a family variant built directly."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..topology import Topology, make_topology


def check_steps(value: object, what: str, example: str, minimum: int = 1) -> int:
    """A whole number of steps >= ``minimum``; a ConfigError that shows a valid spelling otherwise.

    Strings give floats and booleans for typos like ``period=2.5`` or ``every=true``: refuse them here rather
    than train on a silently rounded schedule.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be a whole number of steps >= {minimum}, got {value!r}; e.g. {example}")
    return value


def static_topology(spec: str | Topology, size: int, weights: str, who: str) -> Topology:
    """Asynchronous strategies need fixed neighbour sets: a receiver cannot know a moving sender in advance."""
    graph = make_topology(spec, size, weights=weights)
    if graph.is_dynamic:
        raise ConfigError(
            f"{who} needs a static topology, but {graph!r} changes every step; use ring, torus, exp or a custom "
            "graph (time-varying graphs work with the synchronous strategies dpsgd and sgp)"
        )
    return graph


def check_flag(value: object, what: str) -> bool:
    """True or false, never a truthy string: ``synchronous=maybe`` is a typo to report, not a request."""
    if not isinstance(value, bool | np.bool_):
        raise ConfigError(f"{what} must be true or false, got {value!r}")
    return bool(value)


def check_variant(strategy: object, synchronous: object) -> None:
    """A family's variant class built directly must not be asked for the other mode: SyncGossip(synchronous=False)
    is a contradiction, not a request. ``None`` means the class's own mode."""
    if synchronous is None:
        return
    mode = strategy.synchronous  # type: ignore[attr-defined]
    if check_flag(synchronous, "synchronous") != mode:
        family = type(strategy).__mro__[1].__name__
        raise ConfigError(
            f"{type(strategy).__name__} is {'' if mode else 'a'}synchronous, got synchronous={synchronous!r}; "
            f"build {family}(..., synchronous={synchronous}) instead"
        )
