"""Strategies by short string: "allreduce", "dpsgd:ring", "dpsgd:torus,weights=metropolis", "localsgd:period=8".

The form is ``name[:item,item,...]``; an item ``key=value`` sets an option, a bare item is the topology (or the
option a strategy names in ``bare_option``, e.g. gossip's variant: "gossip:push"). Two keys
compose any strategy instead of being options of each: ``every=k`` wraps it in ``Every(k, ...)`` and ``warmup=W``
runs all-reduce for W steps first (``Schedule``), e.g. "dpsgd:exp1,every=4,warmup=50" (warm-up outermost).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import replace

from ..config import DEFAULT_STRATEGY, RunConfig, environment
from ..errors import ConfigError
from .adpsgd import ADPSGD
from .allreduce import AllReduce
from .async_avg import AsyncAveraging
from .base import Strategy
from .compose import Every, read_strings_with, warmup
from .dpsgd import DPSGD
from .easgd import EASGD
from .fast import FAST
from .gossip import Gossip
from .local_sgd import LocalSGD
from .sgp import SGP

STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "allreduce": AllReduce,
    "localsgd": LocalSGD,
    "dpsgd": DPSGD,
    "fast": FAST,
    "async": AsyncAveraging,
    "adpsgd": ADPSGD,
    "easgd": EASGD,
    "sgp": SGP,
    "gossip": Gossip,
}

COMPOSITION_KEYS = ("every", "warmup")
"""Keys every strategy string accepts; a strategy's own option of the same name takes precedence."""


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
    """A Strategy from a string (or a Strategy, returned as is); clear errors for unknown names and options.

    ``every`` and ``warmup`` (in the string or as overrides, also with a Strategy object) wrap the result.
    """
    if isinstance(spec, Strategy):
        rest = [k for k in overrides if k not in COMPOSITION_KEYS]
        if rest:
            raise ConfigError(
                f"option {rest[0]!r} can only be given with a strategy name, not with a Strategy object "
                f"(which accepts only {', '.join(COMPOSITION_KEYS)})"
            )
        return _compose(spec, overrides)
    name, options = parse_strategy(spec)
    options.update(overrides)
    if name not in STRATEGIES:
        close = difflib.get_close_matches(name, STRATEGIES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown strategy '{name}'{hint}; choose one of: {', '.join(sorted(STRATEGIES))}")
    factory = STRATEGIES[name]
    accepted = [p for p in inspect.signature(factory).parameters if p != "self"]
    bare = getattr(factory, "bare_option", "topology")  # what a bare item means: "gossip:push" is the variant
    if bare != "topology" and "topology" in options and bare not in options:
        options[bare] = options.pop("topology")
    composition = {k: options.pop(k) for k in COMPOSITION_KEYS if k in options and k not in accepted}
    unknown = [k for k in options if k not in accepted]
    if unknown:
        valid = accepted + [k for k in COMPOSITION_KEYS if k not in accepted]
        takes = ", ".join(valid)
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        hint = " (a bare item sets the topology)" if unknown[0] == "topology" else hint
        raise ConfigError(f"strategy '{name}' has no option {unknown[0]!r}{hint}; it takes: {takes}")
    return _compose(factory(**options), composition)


read_strings_with(make_strategy)  # Every and Schedule accept strategy strings through it


def _compose(strategy: Strategy, composition: dict[str, object]) -> Strategy:
    """Wrap in Every, then in the warm-up Schedule, so warm-up all-reduce runs on every step."""
    every = composition.get("every")
    if every is not None:
        strategy = Every(every, strategy)  # Every and warmup check the values themselves
    steps = composition.get("warmup")
    if steps is not None:
        strategy = warmup(steps, strategy)
    return strategy


def strategy_spec(config: RunConfig) -> str:
    """The strategy string a run configuration names: its ``strategy`` (default all-reduce), with its ``topology``
    added when that strategy takes a topology and its string names none."""
    spec = config.strategy or DEFAULT_STRATEGY
    if not config.topology:
        return spec
    name, options = parse_strategy(spec)
    factory = STRATEGIES.get(name)
    takes_topology = factory is not None and "topology" in inspect.signature(factory).parameters
    if takes_topology and "topology" not in options and getattr(factory, "bare_option", "topology") == "topology":
        return f"{spec}{',' if ':' in spec else ':'}topology={config.topology}"
    return spec


def topology_used(config: RunConfig) -> bool:
    """False when the configuration gives a topology that its strategy does not use (it names its own or takes
    none)."""
    return bool(config.topology) and strategy_spec(config) != (config.strategy or DEFAULT_STRATEGY)


def resolve_strategy(strategy: Strategy | str | None = None, config: RunConfig | None = None, **compose: object):
    """The one place a Strategy is resolved, for the Worker and every adapter: a Strategy or string as given, else
    the run configuration's (``fast run --strategy``; ``config`` or this process's environment), else all-reduce.
    ``every=k`` / ``warmup=W`` compose it (None: not given)."""
    if strategy is None:
        strategy = strategy_spec(config if config is not None else environment())
    return make_strategy(strategy, **{k: v for k, v in compose.items() if v is not None})


def strategy_from_environment(default: str | None = None) -> Strategy:
    """The strategy a script gets when it names none: this environment's run configuration (FAST_STRATEGY and
    FAST_TOPOLOGY, set by ``fast run``), else ``default``, else all-reduce."""
    config = environment()
    if config.strategy is None and default is not None:
        config = replace(config, strategy=default)
    return resolve_strategy(None, config)
