"""DiLoCo's strategy string: defaults, the canonical string, and every bad option refused with a valid example.
(Its numbers against the NumPy reference: tests/cases_diloco.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from fast_core import ConfigError, LocalCluster, Worker, make_strategy
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.strategies import DiLoCo
from fast_core.strategies.base import GroupChange
from fast_core.strategies.canonical import canonical_strategy


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
            "diloco:topology=none,period=8,outer_lr=0.7,momentum=0.9,nesterov=true,fragments=1,weights=uniform,"
            "overlap=0,alpha=0.5",
        ),
        (
            "diloco:period=8,fragments=2,overlap=3,alpha=0",
            "diloco:topology=none,period=8,outer_lr=0.7,momentum=0.9,nesterov=true,fragments=2,weights=uniform,"
            "overlap=3,alpha=0.0",
        ),
        (
            "diloco:torus,period=8,fragments=4,nesterov=false,outer_lr=1,momentum=0",
            "diloco:topology=torus,period=8,outer_lr=1.0,momentum=0.0,nesterov=false,fragments=4,weights=uniform,"
            "overlap=0,alpha=0.5",
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
        ("diloco:period=4,overlap=4", r"overlap must be 0 \(off\) or a whole number of steps below period // "
         r"fragments \(4\), so one exchange is done before the next fragment's starts \(from 1 to 3\), got 4; e\.g\. "
         r"diloco:period=4,fragments=1,overlap=1"),
        ("diloco:period=4,fragments=4,overlap=1", r"below period // fragments \(1\).*\(none here: it needs period // "
         r"fragments >= 2\), got 1; e\.g\. diloco:period=8,fragments=4,overlap=1"),
        ("diloco:overlap=-1", r"diloco's overlap must be 0 .* got -1"),
        ("diloco:overlap=1.5", r"diloco's overlap must be 0 .* got 1\.5"),
        ("diloco:ring,period=8,overlap=2", r"overlap=2 needs the all-reduce form: decentralized DiLoCo's gossip round "
         r"\(diloco:ring\) is a neighbour exchange waited within the step, not a nonblocking all-reduce"),
        ("diloco:overlap=2,alpha=1", r"alpha \(the share of the local parameters kept at the merge\) must be in "
         r"\[0, 1\), got 1; e\.g\. diloco:period=100,fragments=1,overlap=1,alpha=0\.5"),
        ("diloco:alpha=0.3", r"alpha=0\.3 merges an overlapped exchange, and overlap is 0; e\.g\. diloco:.*overlap=1,"
         r"alpha=0\.3"),
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


def _overlapped(engine, steps: int) -> Worker:
    """A worker of diloco with overlap=2 after ``steps`` steps: the exchange posted after step 3 is in flight."""
    model = SoftmaxRegression(3, 2, seed=0)
    worker = Worker(model, "diloco:period=4,overlap=2", engine).start()
    for _ in range(steps):
        model.grads()[:] = engine.rank + 1.0
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    return worker


def test_close_and_reset_complete_the_exchange_in_flight_on_every_rank() -> None:
    """close merges it (as ``overlap`` steps later would); reset (a checkpoint) completes it and drops its result."""

    def run(engine):
        worker = _overlapped(engine, 4)
        strategy = worker.strategy
        _, due, request = strategy._pending
        assert due == 5 and not request.done
        worker.model.set_params(np.full_like(worker.model.params(), 2.0))
        worker.resume(step=4)
        assert strategy._pending is None and request.done
        np.testing.assert_array_equal(strategy._theta, np.full_like(strategy._theta, 2.0))
        for _ in range(4):  # posted again after step 7
            worker.before_step()
            worker.model.optimizer_step()
            worker.after_step()
        request = strategy._pending[2]
        worker.close()
        assert strategy._pending is None and request.done
        return strategy._theta

    thetas = LocalCluster(4, timeout=10).run(run)  # the outer step of the exchange merged at close, alike on all
    assert np.abs(thetas[0] - 2.0).max() > 0.1
    for theta in thetas[1:]:
        np.testing.assert_array_equal(theta, thetas[0])


def test_a_loss_drops_the_exchange_in_flight_and_rejoin_leaves_none() -> None:
    def run(engine):
        worker = _overlapped(engine, 4)
        strategy = worker.strategy
        assert strategy._pending is not None
        strategy.abandon(worker.context)
        assert strategy._pending is None
        strategy.rejoin(worker.context, GroupChange(kept=(0, 1, 2), old_size=3, lost=(), size=3))
        assert strategy._pending is None
        return strategy._theta

    thetas = LocalCluster(3, timeout=10).run(run)
    for theta in thetas[1:]:
        np.testing.assert_array_equal(theta, thetas[0])
