"""Strategy strings: parsing, typed options and the errors for unknown names and keys."""

from __future__ import annotations

import pytest

from fast_core import DPSGD, AllReduce, ConfigError, StrategySpec, make_strategy
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
    from fast_core.config.current import forget_run_config
    from fast_core.strategies.spec import strategy_from_environment

    def setenv(name: str, value: str) -> None:  # each value as a new rank process reads it (once)
        monkeypatch.setenv(name, value)
        forget_run_config()

    monkeypatch.delenv("FAST_STRATEGY", raising=False)
    monkeypatch.delenv("FAST_TOPOLOGY", raising=False)
    assert isinstance(strategy_from_environment(), AllReduce)
    setenv("FAST_STRATEGY", "dpsgd")
    setenv("FAST_TOPOLOGY", "exp")
    assert isinstance(strategy_from_environment(), DPSGD) and strategy_from_environment().topology == "exp"
    setenv("FAST_STRATEGY", "dpsgd:ring")  # the strategy's own topology wins
    assert strategy_from_environment().topology == "ring"
    setenv("FAST_STRATEGY", "gossip:push")  # a bare item there is the variant, not a topology
    assert strategy_from_environment().variant == "push"
    setenv("FAST_STRATEGY", "dpsgdd")
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


# StrategySpec: parsed once, canonical with str() ------------------------------------------------------------------

SPELLED = "dpsgd:topology=ring,weights=uniform,compress=none,qgm=0.0"
DOCUMENTED = [  # the strings of the README, docs/, the --help texts and the examples, with their canonical text
    ("allreduce", "allreduce"),
    ("allreduce:compress=fp16", "allreduce:compress=fp16"),
    ("dpsgd:ring", "dpsgd:topology=ring"),
    ("dpsgd:base3", "dpsgd:topology=base3"),
    ("dpsgd:torus,weights=metropolis", "dpsgd:topology=torus,weights=metropolis"),
    ("dpsgd:ring,qgm=0.9", "dpsgd:topology=ring,qgm=0.9"),
    ("dpsgd:ring,compress=int8", "dpsgd:topology=ring,compress=int8"),
    ("dpsgd:ring,every=3", "dpsgd:topology=ring,every=3"),
    ("dpsgd:ring,every=4", "dpsgd:topology=ring,every=4"),
    ("dpsgd:exp1,every=4,warmup=50", "dpsgd:topology=exp1,every=4,warmup=50"),
    (SPELLED, SPELLED),
    ("async", "async"),
    ("async:ring", "async:topology=ring"),
    ("async:torus,staleness=4", "async:topology=torus,staleness=4"),
    ("async:torus,keep_progress=false", "async:topology=torus,keep_progress=false"),
    ("adpsgd:ring", "adpsgd:topology=ring"),
    ("sgp", "sgp"),
    ("sgp:exp1", "sgp:topology=exp1"),
    ("sgp:exp1,every=3", "sgp:topology=exp1,every=3"),
    ("choco:ring", "choco:topology=ring"),
    ("choco:ring,compress=int8", "choco:topology=ring,compress=int8"),
    ("choco:ring,compress=topk:ratio=0.01", "choco:topology=ring,compress=topk:ratio=0.01"),
    ("tracking:ring", "tracking:topology=ring"),
    ("fast:torus", "fast:topology=torus"),
    ("fast:torus,compress=topk:ratio=0.01", "fast:topology=torus,compress=topk:ratio=0.01"),
    ("gossip:push", "gossip:variant=push"),
    ("gossip:synchronous=false", "gossip:synchronous=false"),
    ("gossip:push,synchronous=false", "gossip:variant=push,synchronous=false"),
    ("easgd:tau=4", "easgd:tau=4"),
    ("easgd:tau=4,alpha=0.2", "easgd:tau=4,alpha=0.2"),
    ("easgd:synchronous=false", "easgd:synchronous=false"),
    ("easgd:synchronous=false,alpha=0.1", "easgd:alpha=0.1,synchronous=false"),  # the constructor's order
    ("localsgd:period=8", "localsgd:period=8"),
    ("localsgd:period=1000000000", "localsgd:period=1000000000"),
    ("diloco:period=100", "diloco:period=100"),
    ("diloco:ring", "diloco:topology=ring"),
    ("diloco:period=16,momentum=0.5", "diloco:period=16,momentum=0.5"),
    ("ps:servers=2", "ps:servers=2"),
    ("ps:servers=8,mode=async", "ps:servers=8,mode=async"),
    (" Async : ring , staleness=4", "async:topology=ring,staleness=4"),  # spaces and case do not count
    ("choco:compress=topk:ratio=1e-2,ring", "choco:topology=ring,compress=topk:ratio=0.01"),
    ("choco:ring,compress=(topk:ratio=0.01)", "choco:topology=ring,compress=topk:ratio=0.01"),
]


@pytest.mark.parametrize(("text", "canonical"), DOCUMENTED)
def test_str_of_a_spec_is_its_canonical_text_and_reads_back(text: str, canonical: str) -> None:
    spec = StrategySpec.parse(text)
    assert str(spec) == canonical
    assert StrategySpec.parse(canonical) == spec and str(StrategySpec.parse(canonical)) == canonical
    assert repr(spec.build()) == repr(make_strategy(text))


def test_a_spec_is_a_value_with_its_parts_named() -> None:
    spec = StrategySpec.parse("dpsgd:ring,every=4,warmup=50,weights=metropolis")
    assert (spec.name, spec.topology, spec.every, spec.warmup) == ("dpsgd", "ring", 4, 50)
    assert spec.options == (("topology", "ring"), ("weights", "metropolis"))
    assert spec == StrategySpec.of("dpsgd", {"weights": "metropolis", "topology": "ring", "every": 4, "warmup": 50})
    assert spec.with_options(every=2).every == 2 and spec.every == 4  # frozen: a new value
    assert StrategySpec.parse("dpsgd").with_run_topology("torus") == StrategySpec.parse("dpsgd:torus")
    assert StrategySpec.parse("dpsgd:ring").with_run_topology("torus").topology == "ring"  # its own wins
    assert StrategySpec.parse("gossip:push").with_run_topology("torus") == StrategySpec.parse("gossip:push")
    assert make_strategy(spec) is not make_strategy(spec)  # each build is a fresh strategy


def test_spec_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"unknown strategy 'dpsdg' \(did you mean 'dpsgd'\?\); choose one of"):
        StrategySpec.parse("dpsdg:ring")
    with pytest.raises(ConfigError, match=r"no option 'evry' \(did you mean 'every'\?\); it takes: topology, weights"):
        StrategySpec.parse("dpsgd:ring,evry=4")
    with pytest.raises(ConfigError, match=r"'allreduce' has no option 'topology' \(a bare item sets the topology\)"):
        StrategySpec.parse("allreduce:ring")
    with pytest.raises(ConfigError, match="'gossip' has no option 'topology'; it takes: variant"):
        StrategySpec.parse("gossip:topology=ring")
    with pytest.raises(ConfigError, match="option 'topology' is given twice"):
        StrategySpec.parse("dpsgd:ring,topology=torus")
    with pytest.raises(ConfigError, match="leaves a parenthesis open"):
        StrategySpec.parse("choco:compress=(topk:ratio=0.01")
    with pytest.raises(ConfigError, match="no option 'staleness'"):
        StrategySpec("dpsgd", (("staleness", 3),))  # made directly, checked the same


def test_codecs_read_their_specs_with_the_strategies_grammar() -> None:
    from fast_core import grammar
    from fast_core.compression import TopK, make_codec
    from fast_core.compression import registry as codecs

    assert codecs.parse_spec is grammar.parse_spec  # one grammar, not a copy
    nested = StrategySpec.parse("choco:ring,compress=topk:ratio=0.01").option("compress")
    grouped = StrategySpec.parse("choco:ring,compress=(topk:ratio=1e-2)").option("compress")
    assert nested == grouped == "topk:ratio=0.01"
    assert make_codec(nested) == make_codec(" TopK : ratio = 0.01 ") == TopK(0.01)
    with pytest.raises(ValueError, match="closes a parenthesis it never opened"):
        make_codec("topk:ratio=0.01)")


def test_lists_are_cut_only_where_a_new_strategy_starts() -> None:
    from fast_core.grammar import split_specs

    assert split_specs("dpsgd:ring,every=4") == ["dpsgd:ring,every=4"]
    assert split_specs("allreduce, dpsgd:ring,every=4 ,async") == ["allreduce", "dpsgd:ring,every=4", "async"]
    assert split_specs("fast:compress=topk:ratio=0.01,ps") == ["fast:compress=topk:ratio=0.01", "ps"]
    assert split_specs("choco:compress=(topk:ratio=0.01,x=1),sgp") == ["choco:compress=(topk:ratio=0.01,x=1)", "sgp"]
    assert split_specs("") == []
    with pytest.raises(ConfigError, match="starts with the option 'every=4' before any name"):
        split_specs("every=4,allreduce")


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every string StrategySpec.parse reads from now on."""
    seen: list[str] = []
    parse = StrategySpec.parse.__func__

    def counted(cls: type[StrategySpec], text: str) -> StrategySpec:
        seen.append(text)
        return parse(cls, text)

    monkeypatch.setattr(StrategySpec, "parse", classmethod(counted))
    return seen


def launched(argv: list[str], tmp_path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables ``fast run`` gives its ranks, from its command line, without starting them."""
    from fast_core.cli import main as fast_main
    from fast_core.cli import run as run_command

    jobs = []
    monkeypatch.setattr(run_command, "run_job", lambda job, **_: jobs.append(job) or 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    with pytest.raises(SystemExit):
        fast_main(["run", "-n", "2", "--no-progress", *argv, "x.py"])
    return jobs[0].variables


def test_fast_run_parses_once_and_each_rank_once(parses: list[str], tmp_path, monkeypatch) -> None:
    from fast_core import LocalCluster, RunConfig, Worker
    from fast_core.model.numpy_model import SoftmaxRegression

    config = RunConfig.from_environment(launched(["--strategy", "dpsgd", "--topology", "torus"], tmp_path, monkeypatch))
    assert parses == ["dpsgd"]  # the launcher: once
    assert (config.strategy, config.topology) == ("dpsgd", "torus")

    def rank(engine) -> str:
        worker = Worker(SoftmaxRegression(4, 2), None, engine, config=config).start()
        worker.close()
        return worker.strategy.topology

    assert LocalCluster(2, timeout=30).run(rank) == ["torus", "torus"]
    assert parses == ["dpsgd"] * 3  # then once per rank


def test_fast_run_hands_the_ranks_the_canonical_text(parses: list[str], tmp_path, monkeypatch) -> None:
    from fast_core import RunConfig

    variables = launched(["--strategy", "DPSGD : ring,every=4"], tmp_path, monkeypatch)
    assert RunConfig.from_environment(variables).strategy == "dpsgd:topology=ring,every=4"
    assert parses == ["DPSGD : ring,every=4"]


def test_the_strategy_modules_import_no_cycle_type_only_imports_included() -> None:
    import ast
    from pathlib import Path

    import networkx as nx

    import fast_core

    root = Path(fast_core.__file__).parent
    graph = nx.DiGraph()
    for folder in ("strategies", "grammar"):
        for path in (root / folder).glob("*.py"):
            name = f"fast_core.{folder}" + ("" if path.stem == "__init__" else f".{path.stem}")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fast_core."):
                    if node.module != name and not name.startswith(f"{node.module}."):
                        graph.add_edge(name, node.module)
    assert graph.has_edge("fast_core.strategies.compose", "fast_core.strategies.registry")
    assert graph.has_edge("fast_core.strategies.spec", "fast_core.strategies.registry")
    assert list(nx.simple_cycles(graph)) == []
