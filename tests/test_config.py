"""The run configuration: every FAST_* variable read and checked in one place, and handed to the Worker resolved."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from fast_cli import fast

import fast_core
from fast_core import ConfigError, LocalCluster, Worker
from fast_core.config.run import RunConfig, parse_timeout
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.strategies import DPSGD, AllReduce
from fast_core.strategies.spec import resolve_strategy, strategy_spec, topology_used


@pytest.mark.parametrize("text", ["abc", "nan", "0", "-1", "-inf", ""])
def test_a_bad_timeout_is_one_line_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^FAST_TIMEOUT=.*a number > 0") as caught:
        parse_timeout(text)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="FAST_TIMEOUT"):
        RunConfig.from_environment({"FAST_TIMEOUT": text or " x"})


def test_timeout_inf_means_wait_forever_and_asynchronous_close_works(monkeypatch) -> None:
    assert RunConfig.from_environment({"FAST_TIMEOUT": "inf"}).timeout == math.inf
    assert RunConfig.from_environment({"FAST_TIMEOUT": "2.5"}).timeout == 2.5
    monkeypatch.setenv("FAST_TIMEOUT", "inf")

    def train(engine) -> int:  # an asynchronous strategy's close() joined its thread with timeout + 5: inf crashed
        model = SoftmaxRegression(4, 2, optimizer=SGD(0.1))
        worker = Worker(model, "async:ring", engine, observers=[]).start()
        x, y = np.ones((4, 4)), np.zeros(4, dtype=np.int64)
        for _ in range(5):
            model.compute_gradients(x, y)
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        worker.close()
        assert engine.timeout == math.inf
        return worker.step

    assert LocalCluster(2, timeout=fast_core.run_config().timeout).run(train) == [5, 5]  # what init() gives


def test_the_environment_round_trip_gives_the_configuration_back_whatever_was_set_before() -> None:
    config = RunConfig(
        strategy="dpsgd:ring",
        timeout=30.0,
        straggler=3.0,
        straggler_rank=1,
        run_dir=Path("/runs/a"),
        log_every=5,
        progress=False,
        verbose=True,
        label="dpsgd",
        fault_tolerant=True,
        max_restarts=2,
        max_ranks=8,
        inject_faults=True,
    )
    before = {"FAST_PROGRESS": "1", "FAST_TOPOLOGY": "torus", "FAST_TIMEOUT": "7"}
    assert RunConfig.from_environment({**before, **config.to_environment()}) == config
    assert RunConfig.from_environment(RunConfig().to_environment()) == RunConfig()


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("FAST_STRAGGLER", "abc", "slow-down factor >= 1"),
        ("FAST_STRAGGLER", "0.5", "slow-down factor >= 1"),
        ("FAST_STRAGGLER", "nan", "slow-down factor >= 1"),
        ("FAST_STRAGGLER_RANK", "-1", "whole number >= 0"),
        ("FAST_LOG_EVERY", "0", "whole number >= 1"),
        ("FAST_MAX_RANKS", "many", "whole number >= 0"),
    ],
)
def test_bad_values_name_their_variable(variable: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}='{value}'.*{words}"):
        RunConfig.from_environment({variable: value})


def test_strategy_resolution_adds_the_topology_only_where_it_is_used() -> None:
    config = RunConfig(strategy="dpsgd", topology="torus")
    assert strategy_spec(config) == "dpsgd:topology=torus" and topology_used(config)
    strategy = resolve_strategy(None, config)
    assert isinstance(strategy, DPSGD) and strategy.topology == "torus"
    assert not topology_used(RunConfig(strategy="dpsgd:ring", topology="torus"))
    assert not topology_used(RunConfig(strategy="allreduce", topology="torus"))
    assert isinstance(resolve_strategy(None, RunConfig()), AllReduce)
    assert resolve_strategy("dpsgd:ring", RunConfig(strategy="allreduce")).topology == "ring"  # the script's wins


def test_the_worker_takes_its_configuration_resolved_and_reads_no_variable(monkeypatch) -> None:
    monkeypatch.setenv("FAST_STRATEGY", "allreduce")
    monkeypatch.setenv("FAST_STRAGGLER", "3")
    engine = LocalCluster(1).engine(0)
    worker = Worker(SoftmaxRegression(3, 2), None, engine, config=RunConfig(strategy="dpsgd:ring"))
    assert isinstance(worker.strategy, DPSGD) and list(worker.observers) == []


def test_fast_run_refuses_a_bad_timeout_in_one_line_before_launching(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('the job must not start')\n")
    monkeypatch.setenv("FAST_TIMEOUT", "nan")
    done = fast("run", "-n", "2", "--run-dir", str(tmp_path / "run"), str(script), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "fast: error: FAST_TIMEOUT='nan': give the seconds a rank may wait for a peer, a number > 0 such as 120 "
        "(or inf to wait forever, e.g. under a debugger)"
    ]
