"""Checks several strategies share: whole numbers of steps, and topologies that do not change with time."""

from __future__ import annotations

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

