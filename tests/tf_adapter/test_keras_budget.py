"""fast_tf.Callback under a shared work budget: real model.fit runs on a LocalCluster (TensorFlow backend).

Asynchronous: the job trains exactly the budget's samples summed over ranks, a slower rank (a sleep before each of
its batches) trains fewer batches, and every rank's fit stops. Synchronous: every rank runs the same steps. The
edges: a budget that is not a multiple of the batch size, a budget already spent at the first batch (Keras trains
it anyway; the callback puts the model back), FAST's restarts only where every rank takes part, bad budgets.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import pytest
from keras_cases import BATCH, LR, Recorder, make_model, rank_data

import fast_tf as fast
from fast_core import Budget, ConfigError, Engine, LocalCluster
from fast_core.config.current import forget_run_config

SIZE = 4
EPOCHS = 1000  # more than any rank needs: the budget ends every fit
STEPS = len(rank_data(0)[1]) // BATCH  # batches per pass of a rank's data (4)


class Sleep(keras.callbacks.Callback):
    """Makes this rank slower: a sleep before each batch (on_train_batch_begin keeps Keras' batch dispatch)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_begin(self, batch, logs=None) -> None:
        time.sleep(self.seconds)


def fit(engine: Engine, strategy, budget, *, slow: int | None = None, optimizer=None, extra=()) -> dict:
    """A budgeted fit of this rank's data through fast_tf.Batches; what the worker counted."""
    model = make_model(engine, optimizer or keras.optimizers.SGD(LR))
    x, y = rank_data(engine.rank)
    data = fast.Batches(x, y, batch_size=BATCH, seed=engine.rank)
    callback = fast.Callback(strategy, engine=engine, batch_size=BATCH, budget=budget, average_at_end=False)
    callbacks = [callback, *extra, *([Sleep(0.05)] if engine.rank == slow else [])]
    history = model.fit(data, steps_per_epoch=data.steps, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks)
    worker = callback.worker
    return {
        "steps": worker.step,
        "samples": worker.metrics.samples,
        "job": worker.metrics.job_samples,
        "epochs": len(history.epoch),
        "budget": worker.claims.budget,
        "weights": [w.copy() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
    }


def test_async_job_trains_the_budget_exactly_and_the_slow_rank_fewer_batches() -> None:
    budget = Budget(samples=BATCH * 120)
    results = LocalCluster(SIZE, timeout=180).run(lambda engine: fit(engine, "async:ring", budget, slow=SIZE - 1))
    steps = [r["steps"] for r in results]
    assert sum(r["samples"] for r in results) == budget.samples, steps
    assert all(r["job"] == budget.samples for r in results)  # the job's sum, known on every rank after close
    assert all(r["samples"] == BATCH * r["steps"] > 0 for r in results), results  # every grant trained, whole
    assert steps[-1] < min(steps[:-1]), steps  # the faster ranks trained more of the budget
    assert all(r["epochs"] == -(-r["steps"] // STEPS) < EPOCHS for r in results), results  # stopped by the budget
    assert all(r["iterations"] == r["steps"] for r in results)  # Keras trained no batch beyond the grants


@pytest.mark.parametrize("strategy", ["dpsgd:ring", "allreduce"])
def test_a_lockstep_strategy_runs_equal_steps_under_the_budget(strategy: str) -> None:
    budget = Budget(samples=BATCH * SIZE * 10 + 5)  # 10 steps of the job; the 5 left are less than one step

    def rank(engine: Engine) -> dict:
        optimizer = fast.DistributedOptimizer(keras.optimizers.SGD(LR)) if strategy == "allreduce" else None
        return fit(engine, strategy, budget, slow=SIZE - 1, optimizer=optimizer)

    results = LocalCluster(SIZE, timeout=180).run(rank)
    assert [r["steps"] for r in results] == [10] * SIZE
    assert all(r["samples"] == 10 * BATCH and r["job"] == 10 * BATCH * SIZE for r in results), results
    assert [r["epochs"] for r in results] == [3] * SIZE  # 4 + 4 + 2 batches


def test_fast_restarts_only_after_the_epochs_every_rank_finishes() -> None:
    # reserved: 2 x ahead 1 x 4 ranks x 8 = 64 samples; (448 - 64) // 128 per job epoch = 3 restarts, from epoch 1
    budget = Budget(samples=448, ahead=1)

    def rank(engine: Engine) -> dict:
        recorder = Recorder()
        optimizer = fast.DistributedOptimizer(keras.optimizers.SGD(LR))
        result = fit(engine, "fast:torus", budget, slow=SIZE - 1, optimizer=optimizer, extra=[recorder])
        return {**result, "epoch_weights": recorder.epoch_weights}

    results = LocalCluster(SIZE, timeout=180).run(rank)
    assert sum(r["samples"] for r in results) == budget.samples
    assert all(r["epochs"] >= 3 for r in results)
    for epoch in range(3):  # after FAST's restart every rank holds the best replica
        first = results[0]["epoch_weights"][epoch]
        assert all(np.array_equal(r["epoch_weights"][epoch], first) for r in results), epoch


def test_an_async_budget_is_rounded_down_to_whole_batches(recwarn) -> None:
    budget = Budget(samples=BATCH * 20 + 3)
    results = LocalCluster(2, timeout=180).run(lambda engine: fit(engine, "async:ring", budget))
    assert sum(r["samples"] for r in results) == BATCH * 20 and results[0]["job"] == BATCH * 20
    assert results[0]["budget"] == Budget(samples=BATCH * 20)
    assert any("the budget of 163 samples becomes 160 (20 batches of 8)" in str(w.message) for w in recwarn)


@pytest.mark.parametrize("strategy", ["dpsgd:ring", "async:ring"])
def test_a_budget_spent_before_the_first_batch_leaves_the_model_as_it_started(strategy: str) -> None:
    def rank(engine: Engine) -> dict:
        start = make_model(engine, keras.optimizers.SGD(LR)).get_weights()
        return {**fit(engine, strategy, Budget(seconds=1e-9)), "start": start}  # over at the first claim

    results = LocalCluster(2, timeout=180).run(rank)
    for r in results:
        assert (r["steps"], r["samples"], r["job"], r["epochs"], r["iterations"]) == (0, 0, 0, 1, 0), r
        for trained, start in zip(r["weights"], results[0]["start"], strict=True):  # rank 0's start, untouched
            np.testing.assert_array_equal(trained, start)


# errors ---------------------------------------------------------------------------------------------------------
def one_rank() -> Engine:
    return LocalCluster(1).engine(0)


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_bad_budgets_are_one_line_config_errors(monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"budget=1000: give a fast_core.Budget") as error:
        fast.Callback("async:ring", budget=1000)
    one_line(error)
    with pytest.raises(ConfigError, match=r"Budget\(samples=0\): give a whole number of samples >= 1") as error:
        fast.Callback("async:ring", budget=Budget(samples=0), batch_size=BATCH)
    one_line(error)
    with pytest.raises(ConfigError, match=r"batch_size=0: give the samples of each batch") as error:
        fast.Callback("async:ring", batch_size=0)
    one_line(error)
    model = make_model(one_rank(), keras.optimizers.SGD(LR))
    x, y = rank_data(0)
    callback = fast.Callback("async:ring", engine=one_rank(), budget=Budget(samples=BATCH - 1), batch_size=BATCH)
    with pytest.raises(ConfigError, match=r"Budget\(samples=7\) is less than one batch of 8 samples") as error:
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    one_line(error)
    callback = fast.Callback("async:ring", engine=one_rank(), budget=Budget(samples=100))
    with pytest.raises(ConfigError, match=r"needs batch_size=, the samples of every batch fit trains") as error:
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[callback])
    one_line(error)
    monkeypatch.setenv("FAST_BUDGET_SAMPLES", "lots")  # the run configuration's budget, read by the Worker
    forget_run_config()  # as a new process: this one read its configuration at the first fit above
    with pytest.raises(ConfigError, match="FAST_BUDGET_SAMPLES") as error:
        model.fit(x, y, batch_size=BATCH, verbose=0, callbacks=[fast.Callback("async:ring", engine=one_rank())])
    one_line(error)


def test_the_run_configuration_gives_the_budget_when_none_is(monkeypatch) -> None:
    monkeypatch.setenv("FAST_BUDGET_SAMPLES", str(BATCH * 6))
    model = make_model(one_rank(), keras.optimizers.SGD(LR))
    x, y = rank_data(0)
    callback = fast.Callback("dpsgd:ring", engine=one_rank(), batch_size=BATCH, average_at_end=False)
    history = model.fit(fast.Batches(x, y, batch_size=BATCH), steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0,
                        shuffle=False, callbacks=[callback])  # fmt: skip
    assert (callback.worker.step, callback.worker.metrics.job_samples, len(history.epoch)) == (6, BATCH * 6, 2)


def test_batches_cut_reshuffled_passes_into_full_batches() -> None:
    x = np.arange(10)
    data = fast.Batches(x, x * 10, batch_size=4, seed=3)
    assert data.steps == 2 and data.num_batches is None
    stream = np.concatenate([data[i][0] for i in range(5)])  # 20 samples: two passes, back to back
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
    assert not np.array_equal(stream[:10], stream[10:])  # each pass in its own order
    np.testing.assert_array_equal(data[2][1], data[2][0] * 10)  # the arrays stay paired
    np.testing.assert_array_equal(fast.Batches(x, x, batch_size=4, seed=3)[4][0], data[4][0])  # depends on i only
    with pytest.raises(ValueError, match=r"lengths \[3, 10\]"):
        fast.Batches(x, x[:3], batch_size=4)
    with pytest.raises(ValueError, match="batch_size=0"):
        fast.Batches(x, batch_size=0)
