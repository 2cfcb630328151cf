"""Strategies whose state starts from the worker's own parameters (CHOCO's public copies, DiLoCo's outer
parameters) refuse replicas that start apart, on every rank: without the start broadcast they would never meet."""

from __future__ import annotations

import pytest
from training import CLASSES, FEATURES

from fast_core import LocalCluster, Worker
from fast_core.errors import ConfigError
from fast_core.model.numpy_model import SoftmaxRegression


def _start_apart(engine, strategy: str) -> str:
    model = SoftmaxRegression(FEATURES, CLASSES, seed=engine.rank)  # each rank its own start
    try:
        Worker(model, strategy, engine, broadcast_start=False).start().close()
    except ConfigError as exc:
        return str(exc)
    return "started"


@pytest.mark.parametrize("strategy", ["choco:ring", "diloco:period=4", "choco:ring,warmup=3", "diloco:every=2"])
def test_a_strategy_that_needs_an_equal_start_refuses_replicas_that_start_apart(strategy: str) -> None:
    errors = LocalCluster(2, timeout=20).run(_start_apart, strategy)
    assert errors[0] == errors[1] and " needs every replica to start from the same parameters" in errors[0]
    assert errors[0].startswith(strategy.split(":")[0])  # the strategy, as canonical text
    assert "broadcast_start" in errors[0]


@pytest.mark.parametrize("strategy", ["dpsgd:ring", "localsgd:period=2", "async:ring"])
def test_strategies_that_mix_the_replicas_start_apart_as_asked(strategy: str) -> None:
    assert LocalCluster(2, timeout=20).run(_start_apart, strategy) == ["started", "started"]
