"""Strategy strings: parsing, typed options and the errors for unknown names and keys."""

from __future__ import annotations

import pytest

from fast_core import DPSGD, AllReduce, ConfigError, make_strategy
from fast_core.strategies import parse_strategy
from fast_core.strategies.spec import STRATEGIES


def test_parse_strategy_types_values_and_bare_topology() -> None:
    assert parse_strategy("dpsgd:torus,weights=metropolis") == ("dpsgd", {"topology": "torus", "weights": "metropolis"})
    assert parse_strategy(" Async : ring , staleness=4, rate=0.5, strict=true, bound=inf") == (
        "async",
        {"topology": "ring", "staleness": 4, "rate": 0.5, "strict": True, "bound": float("inf")},
    )
    assert parse_strategy("allreduce") == ("allreduce", {})


def test_make_strategy_builds_configured_objects() -> None:
    strategy = make_strategy("dpsgd:exp1")
    assert isinstance(strategy, DPSGD) and strategy.topology == "exp1" and strategy.weights == "uniform"
    assert isinstance(make_strategy("allreduce"), AllReduce)
    same = DPSGD()
    assert make_strategy(same) is same


def test_unknown_names_and_options_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match=r"unknown strategy 'dpsdg' \(did you mean 'dpsgd'\?\); choose one of"):
        make_strategy("dpsdg:ring")
    with pytest.raises(ConfigError, match=r"strategy 'dpsgd' has no option 'staleness'; it takes: topology, weights"):
        make_strategy("dpsgd:ring,staleness=3")
    with pytest.raises(ConfigError, match="given twice"):
        make_strategy("dpsgd:ring,topology=torus")


def test_uses_gradients_tells_adapters_which_strategies_need_the_gradient() -> None:
    needs = {name for name in STRATEGIES if make_strategy(name).uses_gradients}
    assert needs == {"allreduce", "fast", "tracking", "ps"}
    assert not make_strategy("ps:mode=async").uses_gradients  # Downpour pushes the optimizer's update
    assert make_strategy("dpsgd:warmup=5").uses_gradients  # warm-up runs all-reduce
    assert not make_strategy("dpsgd:every=2").uses_gradients
    assert make_strategy("fast:every=2").uses_gradients


def test_strategy_from_environment_is_what_fast_run_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    from fast_core.strategies.spec import strategy_from_environment

    monkeypatch.delenv("FAST_STRATEGY", raising=False)
    monkeypatch.delenv("FAST_TOPOLOGY", raising=False)
    assert isinstance(strategy_from_environment(), AllReduce)
    monkeypatch.setenv("FAST_STRATEGY", "dpsgd")
    monkeypatch.setenv("FAST_TOPOLOGY", "exp")
    assert isinstance(strategy_from_environment(), DPSGD) and strategy_from_environment().topology == "exp"
    monkeypatch.setenv("FAST_STRATEGY", "dpsgd:ring")  # the strategy's own topology wins
    assert strategy_from_environment().topology == "ring"
    monkeypatch.setenv("FAST_STRATEGY", "gossip:push")  # a bare item there is the variant, not a topology
    assert strategy_from_environment().variant == "push"
    monkeypatch.setenv("FAST_STRATEGY", "dpsgdd")
    with pytest.raises(ConfigError, match="did you mean 'dpsgd'"):
        strategy_from_environment()


def test_families_build_their_synchronous_or_asynchronous_class() -> None:
    """FAST, Gossip and EASGD name a family; each variant is its own class that declares lockstep itself."""
    from fast_core.strategies import (
        EASGD,
        FAST,
        AsyncEASGD,
        AsyncFAST,
        AsyncGossip,
        Gossip,
        SyncEASGD,
        SyncFAST,
        SyncGossip,
    )

    for spec, family, variant in [
        ("fast", FAST, AsyncFAST),
        ("fast:synchronous=true", FAST, SyncFAST),
        ("gossip", Gossip, SyncGossip),
        ("gossip:push,synchronous=false", Gossip, AsyncGossip),
    ]:
        strategy = make_strategy(spec)
        assert type(strategy) is variant and isinstance(strategy, family), spec
        assert "lockstep" in vars(variant) and strategy.lockstep == variant.synchronous, spec
    for synchronous, variant in ((True, SyncEASGD), (False, AsyncEASGD)):
        easgd = make_strategy(f"easgd:tau=3,synchronous={str(synchronous).lower()}")
        assert isinstance(easgd, EASGD) and type(easgd.inner) is variant and easgd.tau == 3
        assert easgd.lockstep is synchronous
    assert SyncGossip("push").synchronous and not AsyncFAST("ring").synchronous  # a variant built directly
    with pytest.raises(ConfigError, match=r"SyncGossip is synchronous, got synchronous=False; build Gossip\("):
        SyncGossip(synchronous=False)
    with pytest.raises(ConfigError, match="synchronous must be true or false, got 'maybe'"):
        make_strategy("fast:synchronous=maybe")
    with pytest.raises(ConfigError, match="EASGD tau .* must be a whole number of steps >= 1, got 0"):
        make_strategy("easgd:tau=0")
