"""fast_core.pipeline.schedule and partition: which batch each stage handles at each tick; balanced stages."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fast_core.pipeline.partition import balanced_split
from fast_core.pipeline.schedule import Schedule


def test_each_stage_forwards_then_backpropagates_every_batch_once_with_its_delay() -> None:
    schedule = Schedule(stages=4, batches=6)
    assert [schedule.delay(k) for k in range(4)] == [6, 4, 2, 0]
    for k in range(4):
        forwards = {t: schedule.forward_batch(k, t) for t in range(schedule.ticks)}
        backwards = {t: schedule.backward_batch(k, t) for t in range(schedule.ticks)}
        assert sorted(b for b in forwards.values() if b is not None) == list(range(6))
        assert sorted(b for b in backwards.values() if b is not None) == list(range(6))
        for t, batch in backwards.items():
            if batch is not None:
                assert forwards[t - schedule.delay(k)] == batch
    for t in range(1, schedule.ticks):  # what a stage reads at tick t its neighbour sent at tick t - 1
        for k in range(1, 4):
            assert schedule.forward_batch(k, t) == schedule.forward_batch(k - 1, t - 1) or (
                schedule.forward_batch(k, t) is None
            )
            if schedule.backward_batch(k - 1, t) is not None:
                assert schedule.backward_batch(k - 1, t) == schedule.backward_batch(k, t - 1)
    assert schedule.backward_batch(0, schedule.ticks - 1) == 5


def test_one_stage_is_plain_training() -> None:
    schedule = Schedule(stages=1, batches=3)
    assert schedule.ticks == 3
    assert [(schedule.forward_batch(0, t), schedule.backward_batch(0, t)) for t in range(3)] == [(0, 0), (1, 1), (2, 2)]


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one stage"):
        Schedule(stages=0)
    with pytest.raises(ValueError, match="stage 3 is not one of 0..2"):
        Schedule(stages=3).delay(3)


def _brute_force(costs: list[float], stages: int) -> float:
    best = np.inf
    for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
        bounds = [0, *cuts, len(costs)]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_the_split_minimises_the_slowest_stage(seed: int) -> None:
    costs = list(np.random.default_rng(seed).integers(1, 20, size=9).astype(float))
    for stages in (1, 2, 3, 4, 9):
        bounds = balanced_split(costs, stages)
        assert bounds[0] == 0 and bounds[-1] == 9 and len(bounds) == stages + 1 and bounds == sorted(set(bounds))
        worst = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        assert worst == _brute_force(costs, stages)


def test_a_split_into_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot split 2 layers into 3"):
        balanced_split([1.0, 2.0], 3)


@pytest.mark.parametrize("window", [1, 2, 3, 5, None])
def test_a_window_bounds_batches_in_flight_and_staleness(window: int | None) -> None:
    schedule = Schedule(stages=3, batches=11, window=window)
    for k in range(3):
        forwards = {schedule.forward_batch(k, t): t for t in range(schedule.ticks)}
        backwards = {schedule.backward_batch(k, t): t for t in range(schedule.ticks)}
        forwards.pop(None, None)
        backwards.pop(None, None)
        assert sorted(forwards) == sorted(backwards) == list(range(11))
        for batch in range(11):  # updates between this batch's forward (before the tick's update) and backward
            between = [b for b, t in backwards.items() if forwards[batch] <= t < backwards[batch] and b != batch]
            assert len(between) <= schedule.staleness(k)
        in_flight = max(
            sum(forwards[b] <= t < backwards[b] + (k == 0) for b in range(11)) for t in range(schedule.ticks)
        )
        assert k > 0 or in_flight <= schedule.in_flight
    assert schedule.staleness(0) == (4 if window is None else min(4, window - 1))
