"""Local SGD and the composition wrappers in one process: strings, errors, repr, and which hooks run when."""

from __future__ import annotations

import pytest

from fast_core import DPSGD, AllReduce, ConfigError, LocalCluster, Worker, make_strategy
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.strategies import Every, LocalSGD, Schedule, Strategy, warmup

# strings ----------------------------------------------------------------------------------------------------------


def test_localsgd_string_and_default_period() -> None:
    assert isinstance(make_strategy("localsgd"), LocalSGD) and make_strategy("localsgd").period == 4
    assert make_strategy("localsgd:period=8").period == 8
    assert make_strategy("localsgd", period=2).period == 2


def test_every_wraps_the_strategy() -> None:
    strategy = make_strategy("dpsgd:ring,every=4")
    assert isinstance(strategy, Every) and strategy.k == 4
    assert isinstance(strategy.inner, DPSGD) and strategy.inner.topology == "ring"
    assert isinstance(make_strategy("localsgd:period=2,every=3").inner, LocalSGD)


def test_warmup_runs_allreduce_first() -> None:
    strategy = make_strategy("dpsgd:exp1,warmup=50")
    assert isinstance(strategy, Schedule)
    (steps, first), (rest, then) = strategy.phases
    assert (steps, rest) == (50, None) and isinstance(first, AllReduce)
    assert isinstance(then, DPSGD) and then.topology == "exp1"


def test_warmup_is_outermost_and_zero_means_none() -> None:
    strategy = make_strategy("dpsgd:ring,every=2,warmup=10")
    assert isinstance(strategy.phases[0][1], AllReduce) and isinstance(strategy.phases[1][1], Every)
    assert isinstance(make_strategy("dpsgd:ring,warmup=0"), DPSGD)
    assert isinstance(warmup(0, "localsgd"), LocalSGD)


def test_composition_keys_as_overrides_also_on_objects() -> None:
    assert make_strategy("dpsgd", every=3).k == 3
    inner = DPSGD("torus")
    wrapped = make_strategy(inner, every=2, warmup=5)
    assert wrapped.phases[1][1].inner is inner
    with pytest.raises(ConfigError, match="'topology' can only be given with a strategy name"):
        make_strategy(inner, topology="ring")


def test_repr_shows_the_composition() -> None:
    assert repr(make_strategy("localsgd:period=8")) == "LocalSGD(period=8)"
    every = "Every(k=4, inner=DPSGD(topology='ring', weights='uniform', compress='none', qgm=0.0))"
    assert repr(make_strategy("dpsgd:ring,every=4")) == every
    assert repr(warmup(100, "dpsgd:ring")) == (
        "Schedule(phases=[(100, AllReduce()), "
        "(None, DPSGD(topology='ring', weights='uniform', compress='none', qgm=0.0))])"
    )


# errors -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("localsgd:period=0", r"LocalSGD period must be a whole number of steps >= 1, got 0; e.g. localsgd:period=8"),
        ("localsgd:period=2.5", r"got 2\.5"),
        ("dpsgd:ring,every=0", r"every must be a whole number of steps >= 1, got 0; e.g. dpsgd:ring,every=4"),
        ("dpsgd:ring,every=true", r"every must be .* got True"),
        ("dpsgd:ring,warmup=-1", r"warmup must be a whole number of steps >= 0, got -1"),
        (
            "dpsgd:ring,period=3",
            r"strategy 'dpsgd' has no option 'period'; it takes: topology, weights, compress, qgm, every, warmup",
        ),
        ("allreduce:staleness=2", r"strategy 'allreduce' has no option 'staleness'; it takes: compress, every, warmup"),
        ("localsgd:8", r"no option 'topology' \(a bare item sets the topology\); it takes: period, every, warmup"),
        ("dpsgd:ring,every=2,every=3", "given twice"),
    ],
)
def test_bad_strings_say_how_to_fix(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_strategy(spec)


def test_bad_schedules_say_how_to_fix() -> None:
    with pytest.raises(ConfigError, match="at least one phase"):
        Schedule([])
    with pytest.raises(ConfigError, match="last Schedule phase runs until training ends: give it None steps"):
        Schedule([(10, "allreduce"), (10, "dpsgd")])
    with pytest.raises(ConfigError, match=r"only the last Schedule phase may have None steps \(phase 0"):
        Schedule([(None, "allreduce"), (None, "dpsgd")])
    with pytest.raises(ConfigError, match="phase 0's steps must be a whole number of steps >= 1, got 0"):
        Schedule([(0, "allreduce"), (None, "dpsgd")])
    with pytest.raises(ConfigError, match=r"must be a \(steps, strategy\) pair"):
        Schedule(["allreduce"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="unknown strategy 'alreduce'"):
        Schedule([(3, "alreduce"), (None, "dpsgd")])


# hook order -------------------------------------------------------------------------------------------------------


class Recorder(Strategy):
    """Logs (hook, worker.step) so the tests see exactly what a wrapper lets through."""

    def __init__(self, tag: str, log: list[tuple[str, str, int]]) -> None:
        self._tag, self._log = tag, log

    def setup(self, worker: Worker) -> None:
        self._log.append((self._tag, "setup", worker.step))

    def before_step(self, worker: Worker) -> None:
        self._log.append((self._tag, "before", worker.step))

    def after_step(self, worker: Worker) -> None:
        self._log.append((self._tag, "after", worker.step))

    def end_epoch(self, worker: Worker, metric: float) -> None:
        self._log.append((self._tag, "epoch", worker.step))

    def close(self, worker: Worker) -> None:
        self._log.append((self._tag, "close", worker.step))


def drive(strategy: Strategy, steps: int, before: bool = True) -> None:
    worker = Worker(SoftmaxRegression(3, 2), strategy, LocalCluster(1).engine(0)).start()
    for _ in range(steps):
        if before:
            worker.before_step()
        worker.after_step()
    worker.end_epoch(0.5)
    worker.close()


def test_every_runs_step_hooks_on_every_kth_step_only() -> None:
    log: list[tuple[str, str, int]] = []
    drive(Every(3, Recorder("a", log)), steps=7)
    hooks = [(hook, step) for _, hook, step in log]
    assert hooks == [("setup", 0), ("before", 2), ("after", 2), ("before", 5), ("after", 5), ("epoch", 7), ("close", 7)]


def test_schedule_closes_and_sets_up_at_the_switch_step() -> None:
    log: list[tuple[str, str, int]] = []
    drive(Schedule([(2, Recorder("a", log)), (1, Recorder("b", log)), (None, Recorder("c", log))]), steps=4)
    assert log == [
        ("a", "setup", 0),
        ("a", "before", 0),
        ("a", "after", 0),
        ("a", "before", 1),
        ("a", "after", 1),
        ("a", "close", 2),
        ("b", "setup", 2),
        ("b", "before", 2),
        ("b", "after", 2),
        ("b", "close", 3),
        ("c", "setup", 3),
        ("c", "before", 3),
        ("c", "after", 3),
        ("c", "epoch", 4),
        ("c", "close", 4),
    ]


def test_schedule_switches_when_only_after_step_is_called() -> None:
    log: list[tuple[str, str, int]] = []
    drive(Schedule([(1, Recorder("a", log)), (None, Recorder("b", log))]), steps=2, before=False)
    assert log == [
        ("a", "setup", 0),
        ("a", "after", 0),
        ("a", "close", 1),
        ("b", "setup", 1),
        ("b", "after", 1),
        ("b", "epoch", 2),
        ("b", "close", 2),
    ]


def test_nested_schedule_counts_from_its_own_start() -> None:
    log: list[tuple[str, str, int]] = []
    inner = Schedule([(1, Recorder("b", log)), (None, Recorder("c", log))])
    drive(Schedule([(2, Recorder("a", log)), (None, inner)]), steps=4)
    setups = [(tag, step) for tag, hook, step in log if hook == "setup"]
    assert setups == [("a", 0), ("b", 2), ("c", 3)]
