"""Observers hear a rank's training as event records (fast_core.observers.events), in order, with the step each
happened at; one attached after the start hears that start at once; records reach them only when one wants them."""

from __future__ import annotations

import time

import numpy as np

from fast_core import LocalCluster, Observer, Worker
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.observers.events import (
    Closed,
    ComputeEnded,
    EpochEnded,
    Event,
    Recorded,
    Started,
    StepEnded,
)


class Log(Observer):
    """Every event heard, in order."""

    def __init__(self, records: bool = False) -> None:
        self.records = records
        self.heard: list[Event] = []

    def _hear(self, event: Event) -> None:
        self.heard.append(event)

    on_start = on_compute_end = on_step_end = on_epoch_end = on_record = on_recovery = on_close = _hear


def _train(log: Log, steps: int = 2) -> Worker:
    model = SoftmaxRegression(3, 2, optimizer=SGD(0.1))
    worker = Worker(model, "allreduce", LocalCluster(1).engine(0), observers=[log])
    for _ in range(steps):
        model.compute_gradients(np.ones((2, 3)), np.zeros(2, dtype=np.int64))
        worker.run_step(model.optimizer_step)
        worker.records.step(loss=0.5, samples=2)
    worker.end_epoch(0.9)
    worker.records.epoch(val_accuracy=0.9)
    worker.close()
    worker.records.result(test_accuracy=0.8)
    return worker


def test_an_observer_hears_each_event_once_in_order_with_its_step() -> None:
    log = Log(records=True)
    worker = _train(log)
    kinds = [type(event).__name__ for event in log.heard]
    assert kinds == [
        "Started",
        *["ComputeEnded", "StepEnded", "Recorded"] * 2,
        "EpochEnded",
        "Recorded",
        "Closed",
        "Recorded",
    ]
    start = log.heard[0]
    assert isinstance(start, Started) and (start.step, start.size) == (0, 1)
    assert start.strategy_name == worker.strategy.name and start.started_at == worker.started_at
    assert start.metrics is worker.metrics and start.budget_samples is None and start.budget_seconds is None
    computed = [e for e in log.heard if isinstance(e, ComputeEnded)]
    assert [e.step for e in computed] == [0, 1] and all(e.compute_seconds >= 0 for e in computed)
    assert [e.step for e in log.heard if isinstance(e, StepEnded)] == [1, 2]
    records = [(e.kind, e.step, dict(e.values)) for e in log.heard if isinstance(e, Recorded)]
    assert records == [
        ("step", 1, {"loss": 0.5, "samples": 2}),
        ("step", 2, {"loss": 0.5, "samples": 2}),
        ("epoch", 2, {"val_accuracy": 0.9}),
        ("result", 2, {"test_accuracy": 0.8}),
    ]
    assert [e.step for e in log.heard if isinstance(e, EpochEnded | Closed)] == [2, 2]


def test_records_are_wanted_only_when_an_observer_wants_them() -> None:
    quiet = Log()
    worker = _train(quiet)
    assert not worker.records.wanted
    assert Worker(SoftmaxRegression(3, 2), "allreduce", LocalCluster(1).engine(0), observers=[Log(True)]).records.wanted
    assert len([e for e in quiet.heard if isinstance(e, Recorded)]) == 4  # made anyway: the observer may ignore them


def test_one_attached_after_the_start_hears_that_start_now() -> None:
    model = SoftmaxRegression(3, 2, optimizer=SGD(0.1))
    worker = Worker(model, "allreduce", LocalCluster(1).engine(0), observers=[]).start()
    time.sleep(0.01)
    late = worker.observers.attach(Log())
    (start,) = late.heard
    assert isinstance(start, Started) and start.started_at == worker.started_at < time.monotonic() - 0.005


def _compute_after_a_pause(end_epoch: bool) -> float:
    """The compute seconds of a step that follows a 0.2 s pause, with or without an epoch's end after the pause."""
    log = Log()
    model = SoftmaxRegression(3, 2, optimizer=SGD(0.1))
    worker = Worker(model, "allreduce", LocalCluster(1).engine(0), observers=[log]).start()
    worker.run_step()
    time.sleep(0.2)  # evaluating, between the step and the epoch's end
    if end_epoch:
        worker.end_epoch(0.5)
    worker.run_step()
    worker.close()
    return [e.compute_seconds for e in log.heard if isinstance(e, ComputeEnded)][-1]


def test_an_epochs_evaluation_is_not_a_steps_compute() -> None:
    assert _compute_after_a_pause(end_epoch=True) < 0.2 <= _compute_after_a_pause(end_epoch=False)
