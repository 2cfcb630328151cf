"""DiLoCo's strategy string: defaults, the canonical string, and every bad option refused with a valid example.
(Its numbers against the NumPy reference: tests/cases_diloco.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from fast_core import ConfigError, LocalCluster, Worker, make_strategy
from fast_core.numpy_model import SoftmaxRegression
from fast_core.strategies import DiLoCo
from fast_core.strategies.base import GroupChange
from fast_core.strategies.spec import canonical_strategy


def test_defaults_are_the_papers_outer_optimizer() -> None:
    strategy = make_strategy("diloco")
    assert isinstance(strategy, DiLoCo)
    assert (strategy.outer_lr, strategy.momentum, strategy.nesterov) == (0.7, 0.9, True)
    assert (strategy.topology, strategy.fragments, strategy.period) == (None, 1, 100)
    assert make_strategy("diloco:ring,period=8").topology == "ring"


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        (
            "diloco:period=8",
            "diloco:topology=none,period=8,outer_lr=0.7,momentum=0.9,nesterov=true,fragments=1,weights=uniform",
        ),
        (
            "diloco:torus,period=8,fragments=4,nesterov=false,outer_lr=1,momentum=0",
            "diloco:topology=torus,period=8,outer_lr=1.0,momentum=0.0,nesterov=false,fragments=4,weights=uniform",
        ),
    ],
)
def test_the_canonical_string_spells_every_option_and_reads_back(spec: str, canonical: str) -> None:
    assert canonical_strategy(make_strategy(spec)) == canonical
    assert canonical_strategy(make_strategy(canonical)) == canonical


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("diloco:period=0", r"diloco's period must be a whole number of steps >= 1, got 0; e\.g\. diloco:period=100"),
        ("diloco:period=2.5", r"diloco's period .* got 2\.5"),
        ("diloco:outer_lr=0", r"diloco's outer_lr must be a number > 0, got 0; e\.g\. diloco:period=100,outer_lr=0\.7"),
        ("diloco:outer_lr=fast", r"diloco's outer_lr must be a number > 0, got 'fast'"),
        ("diloco:momentum=1", r"diloco's momentum \(the outer one\) must be in \[0, 1\), got 1; e\.g\. diloco:"),
        ("diloco:nesterov=maybe", r"diloco's nesterov must be true or false, got 'maybe'; e\.g\. diloco:period=100,"),
        ("diloco:period=4,fragments=5", r"fragments must be a whole number from 1 to the period \(4\), got 5; e\.g\. "),
        ("diloco:fragments=0", r"diloco's fragments .* got 0; e\.g\. diloco:period=100,fragments=4"),
        ("diloco:weights=metropolis", r"weights='metropolis' mixes over a topology.*e\.g\. diloco:ring,weights="),
        ("diloco:lr=0.1", r"strategy 'diloco' has no option 'lr'; it takes: topology, period, outer_lr, momentum"),
    ],
)
def test_bad_options_say_which_and_how_to_fix(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_strategy(spec)


def test_more_fragments_than_parameters_is_refused_at_start() -> None:
    def start(engine) -> None:
        Worker(SoftmaxRegression(2, 2), "diloco:period=8,fragments=8", engine).start()  # 6 parameters

    with pytest.raises(ConfigError, match=r"fragments=8 exceeds the model's 6 parameters; use fragments<=6"):
        LocalCluster(2, timeout=10).run(start)


@pytest.mark.parametrize(("spec", "shared"), [("diloco:period=4", True), ("diloco:ring,period=4", False)])
def test_after_a_loss_the_all_reduce_form_agrees_on_theta_and_the_decentralized_keeps_its_own(
    spec: str, shared: bool
) -> None:
    """A loss in the middle of an outer step can leave some ranks with the new theta and some with the old:
    ``rejoin`` gives all the lowest member's theta and momentum; decentralized DiLoCo's are each rank's own."""

    def run(engine):
        worker = Worker(SoftmaxRegression(3, 2, seed=0), spec, engine).start()
        strategy = worker.strategy
        start = strategy._theta.copy()
        strategy._theta += engine.rank  # as if the ranks had got to different points of an outer step
        strategy._momentum += 10.0 * engine.rank
        strategy.rejoin(worker.context, GroupChange(kept=(0, 1, 2), old_size=3, lost=(), size=3))
        return start, strategy._theta, strategy._momentum

    for rank, (start, theta, momentum) in enumerate(LocalCluster(3, timeout=10).run(run)):
        mine = 0 if shared else rank
        np.testing.assert_array_equal(theta, start + mine)
        np.testing.assert_array_equal(momentum, np.full_like(momentum, 10.0 * mine))
