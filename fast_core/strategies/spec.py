"""Strategies by short string: "allreduce", "dpsgd:ring", "dpsgd:torus,weights=metropolis", "localsgd:period=8",
"diloco:period=100", "ps:servers=2,mode=async".

The form is ``name[:item,item,...]`` (the grammar of fast_core.grammar, which codecs share); an item ``key=value``
sets an option, a bare item is the topology (or the option a strategy names in ``bare_option``, e.g. gossip's
variant: "gossip:push"). A value may be a codec spec: "choco:ring,compress=topk:ratio=0.01". Two keys compose any
strategy instead of being options of each: ``every=k`` wraps it in ``Every(k, ...)`` and ``warmup=W`` runs
all-reduce for W steps first (``Schedule``), e.g. "dpsgd:exp1,every=4,warmup=50" (warm-up outermost).

A string is read once into a ``StrategySpec`` (``StrategySpec.parse``): a value checked against the registry, whose
``str`` is its canonical text and whose ``build`` makes the Strategy. ``fast run`` parses ``--strategy`` once,
hands the canonical text to the ranks (FAST_STRATEGY) and each rank parses it once (``resolve_strategy``).
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from fast_core.config.current import run_config
from fast_core.config.run import DEFAULT_STRATEGY, RunConfig
from fast_core.errors import ConfigError
from fast_core.grammar import format_spec, parse_spec, spelled, typed
from fast_core.strategies import registry
from fast_core.strategies.base import Strategy
from fast_core.strategies.registry import COMPOSITION_KEYS, STRATEGIES
from fast_core.topology import Topology

__all__ = [
    "COMPOSITION_KEYS",
    "STRATEGIES",
    "StrategySpec",
    "make_strategy",
    "parse_strategy",
    "resolve_strategy",
    "run_spec",
    "spelled_option",
    "strategy_from_environment",
    "strategy_spec",
    "topology_used",
]


@dataclass(frozen=True)
class StrategySpec:
    """A strategy string, read and checked: the strategy's name, the options given (in its constructor's order)
    and the composition keys. Equal specs print equal text (``str``); ``build`` makes a fresh Strategy each time.

    Made by ``parse`` (a string) or ``of`` (a name and keyword options); a name the registry does not know or an
    option the strategy does not take is a ConfigError naming the closest spelling. Option values are checked
    when the strategy is built (``build``), by the strategy itself.
    """

    name: str
    options: tuple[tuple[str, object], ...] = ()
    every: int | None = None
    """Run the strategy every this many steps (``Every``); None: every step."""
    warmup: int | None = None
    """All-reduce for this many steps first (``warmup``); None: none."""

    def __post_init__(self) -> None:
        accepted = registry.accepted_options(self.name)
        given = dict(self.options)
        unknown = [key for key in given if key not in accepted]
        if unknown:
            raise _no_such_option(self.name, unknown[0], accepted)
        object.__setattr__(self, "options", tuple((key, given[key]) for key in accepted if key in given))

    @classmethod
    def parse(cls, text: str) -> StrategySpec:
        """Read a strategy string, e.g. "dpsgd:ring,every=4"; an option given twice is an error too."""
        name, options = _read(text, registry.bare_option)
        return cls.of(name, options)

    @classmethod
    def of(cls, name: str, options: Mapping[str, object] | None = None) -> StrategySpec:
        """A spec from a strategy name and keyword options, ``every`` and ``warmup`` among them."""
        name = name.strip().lower()
        accepted = registry.accepted_options(name)
        rest = dict(options or {})
        composition = {key: rest.pop(key) for key in COMPOSITION_KEYS if key in rest and key not in accepted}
        return cls(name, tuple(rest.items()), **composition)

    @property
    def topology(self) -> object:
        """The topology option given (a name such as "ring", or an object), None when none is."""
        return self.option("topology")

    def option(self, key: str, default: object = None) -> object:
        return dict(self.options).get(key, default)

    def with_options(self, **overrides: object) -> StrategySpec:
        """This spec with ``overrides`` set (composition keys included), checked as ``of`` checks."""
        composition = {key: getattr(self, key) for key in COMPOSITION_KEYS if getattr(self, key) is not None}
        return StrategySpec.of(self.name, {**dict(self.options), **composition, **overrides})

    def with_run_topology(self, topology: str | None) -> StrategySpec:
        """This spec with a run's topology (``fast run --topology``, FAST_TOPOLOGY) added, when the strategy takes
        a topology, names none, and a bare item means its topology; else this spec."""
        takes = "topology" in registry.accepted_options(self.name) and registry.bare_option(self.name) == "topology"
        if not topology or not takes or "topology" in dict(self.options):
            return self
        return replace(self, options=(*self.options, ("topology", topology)))

    def build(self) -> Strategy:
        """A new Strategy as this spec describes it (the strategy checks its option values here)."""
        strategy = registry.factory(self.name)(**dict(self.options))
        return registry.compose(strategy, {key: getattr(self, key) for key in COMPOSITION_KEYS})

    def __str__(self) -> str:
        """The canonical text: every option as ``key=value`` in the constructor's order, then every, warmup."""
        items = [(key, spelled_option(value)) for key, value in self.options]
        items += [(key, spelled(getattr(self, key))) for key in COMPOSITION_KEYS if getattr(self, key) is not None]
        return format_spec(self.name, items)


def _no_such_option(name: str, key: str, accepted: list[str]) -> ConfigError:
    valid = accepted + [k for k in COMPOSITION_KEYS if k not in accepted]
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if key == "topology" and registry.bare_option(name) == "topology":
        hint = " (a bare item sets the topology)"
    return ConfigError(f"strategy '{name}' has no option {key!r}{hint}; it takes: {', '.join(valid)}")


def spelled_option(value: object) -> str:
    """An option's value as canonical text: as a strategy string spells it, a Topology or graph object by its
    representation and a digest of its weights or edges (so two ranks' objects compare)."""
    if isinstance(value, np.bool_):
        return spelled(bool(value))
    if isinstance(value, Topology):
        phases = (value.mixing_matrix(k).tobytes() for k in range(value.period))
        return f"{value!r}#{_digest(b''.join(phases))}"
    if isinstance(value, nx.Graph):
        edges = sorted((str(u), str(v), repr(d.get("weight"))) for u, v, d in value.edges(data=True))
        return f"{type(value).__name__}(nodes={value.number_of_nodes()})#{_digest(repr(edges).encode())}"
    return spelled(value)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=6).hexdigest()


def parse_strategy(spec: str) -> tuple[str, dict[str, object]]:
    """A strategy string's name and typed options as the grammar reads them, unchecked (a bare item as
    ``topology``); ``StrategySpec.parse`` reads and checks."""
    return _read(spec, lambda name: "topology")


def _read(text: str, bare_option: Callable[[str], str]) -> tuple[str, dict[str, object]]:
    """The name and typed options of a strategy string, a bare item under ``bare_option(name)``."""
    parsed = parse_spec(text)
    bare = bare_option(parsed.name)
    options: dict[str, object] = {}
    for key, value in parsed.items:
        key = bare if key is None else key
        if key in options:
            raise ConfigError(f"option '{key}' is given twice in strategy '{text}'")
        options[key] = typed(value)
    return parsed.name, options


def make_strategy(spec: str | StrategySpec | Strategy, **overrides: object) -> Strategy:
    """A Strategy from a string or a StrategySpec (a Strategy is returned as is); clear errors for unknown names
    and options. ``every`` and ``warmup`` (in the string or as overrides, also with a Strategy object) wrap it."""
    if isinstance(spec, Strategy):
        rest = [k for k in overrides if k not in COMPOSITION_KEYS]
        if rest:
            raise ConfigError(
                f"option {rest[0]!r} can only be given with a strategy name, not with a Strategy object "
                f"(which accepts only {', '.join(COMPOSITION_KEYS)})"
            )
        return registry.compose(spec, overrides)
    parsed = spec if isinstance(spec, StrategySpec) else StrategySpec.parse(spec)
    return (parsed.with_options(**overrides) if overrides else parsed).build()


def run_spec(config: RunConfig) -> StrategySpec:
    """The strategy a run configuration names, parsed once: its ``strategy`` (default all-reduce), with its
    ``topology`` added when that strategy takes a topology and its string names none."""
    return StrategySpec.parse(config.strategy or DEFAULT_STRATEGY).with_run_topology(config.topology)


def strategy_spec(config: RunConfig) -> str:
    """The canonical text of ``run_spec(config)``."""
    return str(run_spec(config))


def topology_used(config: RunConfig) -> bool:
    """False when the configuration gives a topology that its strategy does not use (it names its own or takes
    none)."""
    named = StrategySpec.parse(config.strategy or DEFAULT_STRATEGY)
    return bool(config.topology) and named.with_run_topology(config.topology) != named


def resolve_strategy(
    strategy: Strategy | StrategySpec | str | None = None, config: RunConfig | None = None, **compose: object
) -> Strategy:
    """The one place a Strategy is resolved, for the Worker and every adapter: a Strategy, StrategySpec or string as
    given, else the run configuration's (``fast run --strategy``; ``config`` or this process's,
    ``fast_core.run_config()``), else all-reduce; a string is parsed once. ``every=k`` / ``warmup=W`` compose it
    (None: not given)."""
    if strategy is None:
        strategy = run_spec(config if config is not None else run_config())
    return make_strategy(strategy, **{k: v for k, v in compose.items() if v is not None})


def strategy_from_environment(default: str | None = None) -> Strategy:
    """The strategy a script gets when it names none: this process's run configuration (FAST_STRATEGY and
    FAST_TOPOLOGY, set by ``fast run``, read once by ``fast_core.run_config()``), else ``default``, else all-reduce."""
    config = run_config()
    if config.strategy is None and default is not None:
        config = replace(config, strategy=default)
    return resolve_strategy(None, config)
