"""Strategies by short string: "allreduce", "dpsgd:ring", "dpsgd:torus,weights=metropolis", "localsgd:period=8",
"diloco:period=100", "ps:servers=2,mode=async".

The form is ``name[:item,item,...]``; an item ``key=value`` sets an option, a bare item is the topology (or the
option a strategy names in ``bare_option``, e.g. gossip's variant: "gossip:push"). Two keys
compose any strategy instead of being options of each: ``every=k`` wraps it in ``Every(k, ...)`` and ``warmup=W``
runs all-reduce for W steps first (``Schedule``), e.g. "dpsgd:exp1,every=4,warmup=50" (warm-up outermost).
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import replace

import networkx as nx
import numpy as np

from fast_core.config.run import DEFAULT_STRATEGY, RunConfig, environment
from fast_core.errors import ConfigError
from fast_core.strategies.adpsgd import ADPSGD
from fast_core.strategies.allreduce import AllReduce
from fast_core.strategies.async_avg import AsyncAveraging
from fast_core.strategies.base import Strategy
from fast_core.strategies.choco import CHOCO
from fast_core.strategies.compose import Every, Schedule, read_strings_with, warmup
from fast_core.strategies.diloco import DiLoCo
from fast_core.strategies.dpsgd import DPSGD
from fast_core.strategies.easgd import EASGD
from fast_core.strategies.fast import FAST
from fast_core.strategies.gossip import Gossip
from fast_core.strategies.local_sgd import LocalSGD
from fast_core.strategies.ps import ParameterServer
from fast_core.strategies.sgp import SGP
from fast_core.strategies.tracking import GradientTracking
from fast_core.topology import Topology

STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "allreduce": AllReduce,
    "localsgd": LocalSGD,
    "diloco": DiLoCo,
    "dpsgd": DPSGD,
    "choco": CHOCO,
    "tracking": GradientTracking,
    "fast": FAST,
    "async": AsyncAveraging,
    "adpsgd": ADPSGD,
    "easgd": EASGD,
    "sgp": SGP,
    "gossip": Gossip,
    "ps": ParameterServer,
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


def canonical_strategy(strategy: Strategy, shared: bool = False) -> str:
    """The strategy string of ``strategy`` with every option spelled out, e.g. "localsgd:period=4" or
    "dpsgd:topology=ring,weights=uniform,compress=none,qgm=0.0,every=4": equal on two ranks exactly when they run the
    same algorithm with the same options. For the built-in strategies with named topologies ``make_strategy`` reads it
    back; a Topology or graph object is shown with a digest of its edges and weights. ``shared=True`` leaves out
    the options each rank may choose for itself (``Strategy.rank_options``): what ``Worker.start`` compares across
    ranks."""
    if isinstance(strategy, Schedule):
        (first, warm), *rest = strategy.phases
        then = canonical_strategy(rest[0][1], shared) if len(rest) == 1 else ""
        if type(warm) is AllReduce and _composable(then, "warmup"):
            return _with(then, "warmup", first)  # what warmup=W builds
        phases = ";".join(f"{_text(n)}:{canonical_strategy(s, shared)}" for n, s in strategy.phases)
        return f"schedule({phases})"
    factory = STRATEGIES.get(getattr(strategy, "name", ""))
    if isinstance(factory, type) and isinstance(strategy, factory):
        names = [p for p in inspect.signature(factory).parameters if p != "self"]
        if all(hasattr(strategy, p) for p in names):
            names = [p for p in names if not (shared and p in strategy.rank_options)]
            options = ",".join(f"{p}={_text(getattr(strategy, p))}" for p in names)
            return f"{strategy.name}:{options}" if options else strategy.name
    if isinstance(strategy, Every):
        inner = canonical_strategy(strategy.inner, shared)
        composable = _composable(inner, "every", "warmup")
        return _with(inner, "every", strategy.k) if composable else f"every({strategy.k},{inner})"
    kind = type(strategy)
    return f"{kind.__module__}.{kind.__qualname__}:" + re.sub(r" at 0x[0-9a-fA-F]+", "", repr(strategy))


def _composable(spec: str, *keys: str) -> bool:
    """Whether a key may be added to ``spec``: a plain strategy string without ``keys`` (make_strategy applies
    ``every`` inside ``warmup``)."""
    return spec.split(":")[0] in STRATEGIES and not any(re.search(rf"[:,]{key}=", spec) for key in keys)


def _with(spec: str, key: str, value: object) -> str:
    return f"{spec}{',' if ':' in spec else ':'}{key}={_text(value)}"


def _text(value: object) -> str:
    """An option's value as a strategy string spells it (parse_strategy reads it back)."""
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, Topology):
        phases = (value.mixing_matrix(k).tobytes() for k in range(value.period))
        return f"{value!r}#{_digest(b''.join(phases))}"
    if isinstance(value, nx.Graph):
        edges = sorted((str(u), str(v), repr(d.get("weight"))) for u, v, d in value.edges(data=True))
        return f"{type(value).__name__}(nodes={value.number_of_nodes()})#{_digest(repr(edges).encode())}"
    return str(value)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


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
