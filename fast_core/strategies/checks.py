"""Checks several strategies share: whole numbers of steps, static topologies, a family variant built directly."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fast_core.errors import ConfigError
from fast_core.topology import Topology, make_topology


def check_steps(value: object, what: str, example: str, minimum: int = 1) -> int:
    """A whole number of steps >= ``minimum``; a ConfigError that shows a valid spelling otherwise.

    Strings give floats and booleans for typos like ``period=2.5`` or ``every=true``: refuse them here rather
    than train on a silently rounded schedule.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what} must be a whole number of steps >= {minimum}, got {value!r}; e.g. {example}")
    return value


def check_fraction(value: object, what: str, example: str) -> float:
    """A number in (0, 1] (a step size or a mixing weight); a ConfigError that shows a valid spelling otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"{what} must be a number in (0, 1], got {value!r}; e.g. {example}")
    return float(value)


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


class ChoosesVariant:
    """Mixin of a strategy family with a synchronous and an asynchronous class (FAST, Gossip, EASGD's round).

    ``Family._variant(synchronous)`` is the class that runs that mode (None: the family's own default). Each variant
    registers itself by subclassing the family, so the family's module never imports the variant's module and the
    import graph keeps no cycle; importing ``fast_core.strategies`` defines them all.
    """

    synchronous: ClassVar[bool]
    _variants: ClassVar[dict[bool, type]]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if ChoosesVariant in cls.__bases__:
            cls._variants = {}  # a family
        else:
            cls._variants[cls.synchronous] = cls  # a variant, into its family's table

    @classmethod
    def _variant(cls, synchronous: object) -> type:
        if ChoosesVariant not in cls.__bases__:
            return cls  # a variant built directly (check_variant refuses the other mode)
        mode = cls.synchronous if synchronous is None else check_flag(synchronous, "synchronous")
        try:
            return cls._variants[mode]
        except KeyError:
            raise ConfigError(f"{cls.__name__} has no {'' if mode else 'a'}synchronous variant") from None
