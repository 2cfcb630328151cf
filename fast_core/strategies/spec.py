"""Strategies by short string: "allreduce", "dpsgd:ring", "dpsgd:torus,weights=metropolis".

The form is ``name[:item,item,...]``; an item ``key=value`` sets an option, a bare item is the topology.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable

from ..errors import ConfigError
from .allreduce import AllReduce
from .base import Strategy
from .dpsgd import DPSGD

STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "allreduce": AllReduce,
    "dpsgd": DPSGD,
}


def _value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("inf", "infinity", "none"):
        return None if lowered == "none" else float("inf")
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_strategy(spec: str) -> tuple[str, dict[str, object]]:
    """Split a strategy string into its name and keyword options (values typed as int/float/bool/str)."""
    name, _, rest = spec.strip().partition(":")
    options: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            key, value = "topology", item
        if key.strip() in options:
            raise ConfigError(f"option '{key.strip()}' is given twice in strategy '{spec}'")
        options[key.strip()] = _value(value.strip())
    return name.strip().lower(), options


def make_strategy(spec: str | Strategy, **overrides: object) -> Strategy:
    """A Strategy from a string (or a Strategy, returned as is); clear errors for unknown names and options."""
    if isinstance(spec, Strategy):
        if overrides:
            raise ConfigError("options can only be given with a strategy name, not with a Strategy object")
        return spec
    name, options = parse_strategy(spec)
    options.update(overrides)
    if name not in STRATEGIES:
        close = difflib.get_close_matches(name, STRATEGIES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown strategy '{name}'{hint}; choose one of: {', '.join(sorted(STRATEGIES))}")
    factory = STRATEGIES[name]
    accepted = [p for p in inspect.signature(factory).parameters if p != "self"]
    unknown = [k for k in options if k not in accepted]
    if unknown:
        takes = ", ".join(accepted) if accepted else "no options"
        raise ConfigError(f"strategy '{name}' has no option {unknown[0]!r}; it takes: {takes}")
    return factory(**options)
