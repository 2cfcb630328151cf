"""The strategy names: one registry that strategy strings (spec.py) and composition (compose.py) both read.

Each strategy class registers itself under its ``name`` (``@registered``); compose.py registers how the two keys
every strategy string accepts, ``every`` and ``warmup``, wrap a strategy (``@composes``). The registry imports no
strategy, so any module of the package may import it; ``fast_core.strategies`` imports every strategy module, so
the registry is full whenever a strategy string is read.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from fast_core.errors import ConfigError

if TYPE_CHECKING:
    from fast_core.strategies.base import Strategy

STRATEGIES: dict[str, Callable[..., Strategy]] = {}
"""Strategy name -> the class (or family) a strategy string builds."""

COMPOSITION_KEYS = ("every", "warmup")
"""Keys every strategy string accepts, innermost first (warm-up all-reduce runs on every step); a strategy's own
option of the same name takes precedence."""

_COMPOSERS: dict[str, Callable[[Strategy, object], Strategy]] = {}

Registered = TypeVar("Registered", bound=type)


def registered(cls: Registered) -> Registered:
    """Class decorator: strategy strings name ``cls`` by its ``name``."""
    STRATEGIES[cls.name] = cls
    return cls


def composes(key: str) -> Callable[[Callable[[Strategy, object], Strategy]], Callable[[Strategy, object], Strategy]]:
    """Decorator of ``wrap(strategy, value) -> Strategy``: what the composition key ``key`` does."""
    if key not in COMPOSITION_KEYS:
        raise ValueError(f"composition key {key!r} is not one of {', '.join(COMPOSITION_KEYS)}")

    def register(wrap: Callable[[Strategy, object], Strategy]) -> Callable[[Strategy, object], Strategy]:
        _COMPOSERS[key] = wrap
        return wrap

    return register


def factory(name: str) -> Callable[..., Strategy]:
    """The class registered as ``name``; an unknown name is a ConfigError with the closest known one."""
    if name not in STRATEGIES:
        close = difflib.get_close_matches(name, STRATEGIES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown strategy '{name}'{hint}; choose one of: {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name]


def accepted_options(name: str) -> list[str]:
    """The options strategy ``name`` takes: its constructor's parameters, in their order."""
    return [p for p in inspect.signature(factory(name)).parameters if p != "self"]


def bare_option(name: str) -> str:
    """The option a bare item sets for strategy ``name``: its topology, unless it names another (gossip's
    ``variant``: "gossip:push")."""
    return getattr(factory(name), "bare_option", "topology")


def compose(strategy: Strategy, composition: Mapping[str, object]) -> Strategy:
    """``strategy`` wrapped by the composition keys given (None: not given), innermost first."""
    for key in COMPOSITION_KEYS:
        value = composition.get(key)
        if value is not None:
            strategy = _COMPOSERS[key](strategy, value)  # Every and warmup check the values themselves
    return strategy
