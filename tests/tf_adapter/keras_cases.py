"""fast_tf's multi-rank cases: ``model.fit`` with fast_tf.Callback against NumPy references, on any Keras backend.

Each ``case_*`` takes this rank's engine, runs the same code on every rank and asserts. pytest runs them in-process
on a LocalCluster with the TensorFlow backend (test_keras_local.py); under mpiexec they run once per other backend:

    KERAS_BACKEND=jax OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/tf_adapter/keras_cases.py [name ...]

The model is a softmax regression (one Dense layer), whose gradient fast_core.model.numpy_model computes exactly, so a
strategy's result through Keras can be compared with a dense NumPy simulation of all ranks.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import keras
import numpy as np

import fast_tf as fast
from fast_core import FAST, Budget, Engine, ModelMismatchError, mpi_engine
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.topology import make_topology

FEATURES, CLASSES, BATCH, STEPS, EPOCHS, LR = 6, 3, 8, 4, 2, 0.1
TOTAL_STEPS = STEPS * EPOCHS
ATOL = 2e-5  # float32 training against a float64 reference over 8 steps


# the shared task ------------------------------------------------------------------------------------------------
def rank_data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples of ``rank``: STEPS batches, fitted in order (shuffle=False) in every epoch."""
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=(BATCH * STEPS, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, BATCH * STEPS)


def initial_weights(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    kernel, bias = rng.normal(0.0, 0.5, (FEATURES, CLASSES)), rng.normal(0.0, 0.1, CLASSES)
    return [kernel.astype(np.float32), bias.astype(np.float32)]


def make_model(engine: Engine, optimizer: keras.optimizers.Optimizer, bias: bool = True) -> keras.Model:
    """Every rank starts elsewhere (seed = rank): the callback must give all rank 0's weights."""
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES, use_bias=bias)])
    model.set_weights(initial_weights(engine.rank)[: 2 if bias else 1])
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(engine: Engine, strategy, optimizer, before=(), after=(), **options) -> tuple[keras.Model, fast.Callback]:
    """``model.fit`` on this rank's data with the callback (no averaging at the end unless asked)."""
    model = make_model(engine, optimizer)
    options.setdefault("average_at_end", False)
    callback = fast.Callback(strategy, engine=engine, **options)
    x, y = rank_data(engine.rank)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[*before, callback, *after])
    return model, callback


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([w.reshape(-1) for w in model.get_weights()]).astype(np.float64)


def simulate(size: int, update) -> np.ndarray:
    """All ranks' parameters (size x P) after TOTAL_STEPS steps from rank 0's start; ``update(step, X, G)`` returns
    the next X given every rank's gradient G (size x P) at its own parameters."""
    reference = SoftmaxRegression(FEATURES, CLASSES)
    start = np.concatenate([w.reshape(-1) for w in initial_weights(0)]).astype(np.float64)
    states = np.tile(start, (size, 1))
    data = [rank_data(r) for r in range(size)]
    for step in range(TOTAL_STEPS):
        batch = slice((step % STEPS) * BATCH, (step % STEPS + 1) * BATCH)
        grads = np.empty_like(states)
        for r, (x, y) in enumerate(data):
            reference.set_params(states[r])
            reference.compute_gradients(x[batch].astype(np.float64), y[batch])
            grads[r] = reference.grads()
        states = update(step, states, grads)
    return states


def same_on_every_rank(engine: Engine, values: np.ndarray) -> bool:
    low, high = np.array(values, dtype=np.float64), np.array(values, dtype=np.float64)
    engine.allreduce(low, op="min")
    engine.allreduce(high, op="max")
    return bool(np.array_equal(low, high))


class Recorder(keras.callbacks.Callback):
    """Keeps what other callbacks left: the epoch logs, and weights at the start and end of training."""

    def __init__(self) -> None:
        super().__init__()
        self.logs: list[dict] = []
        self.begin: list[np.ndarray] | None = None
        self.end: list[np.ndarray] | None = None
        self.epoch_weights: list[np.ndarray] = []

    def on_train_begin(self, logs=None) -> None:
        self.begin = self.model.get_weights()

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.logs.append(dict(logs))
        self.epoch_weights.append(flat_weights(self.model))

    def on_train_end(self, logs=None) -> None:
        self.end = self.model.get_weights()


# cases ----------------------------------------------------------------------------------------------------------
def case_flat_pair_round_trips_and_the_model_keeps_no_alias(engine: Engine) -> None:
    """write_flat then changing the buffer must not change the model: JAX may alias NumPy memory (handoff)."""
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(257), keras.layers.Dense(CLASSES)])
    variables = model.trainable_variables
    layout = fast.layout_of(variables)
    values = np.random.default_rng(engine.rank).normal(size=layout.size).astype(np.float32)
    buffer = values.copy()
    fast.write_flat(variables, layout, buffer)
    buffer += 1.0  # the caller reuses its buffer
    np.testing.assert_array_equal(fast.read_flat(variables, layout), values)
    out = layout.empty()
    assert fast.read_flat(variables, layout, out=out) is out


def case_dpsgd_matches_the_numpy_reference_with_one_read_and_write_per_step(engine: Engine) -> None:
    model, callback = fit(engine, "dpsgd:ring", keras.optimizers.SGD(LR))
    graph = make_topology("ring", engine.size)
    expected = simulate(engine.size, lambda step, x, g: graph.mixing_matrix(step) @ x - LR * g)
    np.testing.assert_allclose(flat_weights(model), expected[engine.rank], rtol=0, atol=ATOL)
    # the start (broadcast) plus one read and one write per step
    assert (callback.adapter.reads, callback.adapter.writes) == (1 + TOTAL_STEPS, 1 + TOTAL_STEPS)


def case_mixing_every_k_steps_touches_the_variables_only_then(engine: Engine) -> None:
    every = 3
    # without the per-epoch consensus distance, which reads the parameters once an epoch
    model, callback = fit(engine, "dpsgd:ring", keras.optimizers.SGD(LR), every=every, consensus=False)
    mixes = TOTAL_STEPS // every
    assert (callback.adapter.reads, callback.adapter.writes) == (1 + mixes, 1 + mixes), callback.adapter.reads
    w = make_topology("ring", engine.size).mixing_matrix(0)
    sent: list[np.ndarray] = []

    def update(step: int, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        if not sent:
            sent.append(x.copy())  # the start, sent at setup
        x = x - LR * g
        if (step + 1) % every == 0:  # Every(k, D-PSGD): mix what was sent, keep the local steps since
            x = w @ sent[0] + (x - sent[0])
            sent[0] = x.copy()
        return x

    expected = simulate(engine.size, update)
    np.testing.assert_allclose(flat_weights(model), expected[engine.rank], rtol=0, atol=ATOL)


def case_allreduce_keeps_ranks_identical_and_matches_sgd_with_momentum(engine: Engine) -> None:
    optimizer = fast.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9))
    model, _ = fit(engine, "allreduce", optimizer)
    velocity: list[np.ndarray] = []

    def update(step: int, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        velocity[:] = [0.9 * (velocity[0] if velocity else 0.0) - LR * g.mean(axis=0)]
        return x + velocity[0]

    expected = simulate(engine.size, update)
    params = flat_weights(model)
    assert same_on_every_rank(engine, params), "all-reduce left the ranks with different parameters"
    np.testing.assert_allclose(params, expected[engine.rank], rtol=0, atol=ATOL)


def case_fast_applies_neighbour_gradients_through_the_optimizer(engine: Engine) -> None:
    optimizer = fast.DistributedOptimizer(keras.optimizers.SGD(LR))
    strategy = FAST("torus", synchronous=True, restart_every=None)
    model, _ = fit(engine, strategy, optimizer)
    graph = make_topology("torus", engine.size)

    def update(step: int, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return np.stack([x[i] - LR * (g[i] + sum(g[p] for p in graph.in_neighbors(i))) for i in range(len(x))])

    expected = simulate(engine.size, update)
    np.testing.assert_allclose(flat_weights(model), expected[engine.rank], rtol=0, atol=ATOL)


def case_logs_become_the_mean_over_ranks(engine: Engine) -> None:
    local, seen = Recorder(), Recorder()
    fit(engine, "dpsgd:ring", keras.optimizers.SGD(LR), before=[local], after=[seen])
    for mine, averaged in zip(local.logs, seen.logs, strict=True):
        total = np.array([mine["loss"]])
        engine.allreduce(total)
        assert abs(averaged["loss"] - total[0] / engine.size) < 1e-9, (averaged, mine)
        assert averaged["consensus_distance"] >= 0.0
    assert same_on_every_rank(engine, np.array([logs["loss"] for logs in seen.logs]))
    # an asynchronous strategy logs each rank's own numbers: an epoch-end collective would wait for the slowest rank
    local, seen = Recorder(), Recorder()
    fit(engine, "async:ring", keras.optimizers.SGD(LR), before=[local], after=[seen])
    assert seen.logs == local.logs and "consensus_distance" not in seen.logs[0], seen.logs


def case_fast_restart_leaves_every_rank_on_the_best_replica(engine: Engine) -> None:
    seen = Recorder()
    optimizer = fast.DistributedOptimizer(keras.optimizers.SGD(LR))
    fit(engine, "fast:torus", optimizer, after=[seen])  # no validation data: the lowest local loss wins
    for weights in seen.epoch_weights:
        assert same_on_every_rank(engine, weights), "after FAST's restart the ranks differ"


def case_start_broadcasts_and_end_averages_batchnorm_statistics(engine: Engine) -> None:
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.BatchNormalization(), keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for variable in model.non_trainable_variables:
        if fast.variables.dtype_of(variable) == "float32":
            variable.assign(np.full(variable.shape, 1.0 + engine.rank, dtype=np.float32))
    x, y = rank_data(engine.rank)
    x = x * (1.0 + engine.rank)  # different statistics on every rank
    before, after = Recorder(), Recorder()
    callback = fast.Callback("dpsgd:ring", engine=engine)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[before, callback, after])
    mean_index = [v.name for v in model.weights].index("moving_mean")
    started = after.begin[mean_index]
    np.testing.assert_array_equal(started, np.ones_like(started))  # rank 0's
    local = np.array(before.end[mean_index], dtype=np.float64)
    engine.allreduce(local)
    np.testing.assert_allclose(model.get_weights()[mean_index], local / engine.size, rtol=1e-6, atol=1e-6)


def case_different_models_raise_on_every_rank(engine: Engine) -> None:
    model = make_model(engine, keras.optimizers.SGD(LR), bias=engine.rank != engine.size - 1)
    callback = fast.Callback("dpsgd:ring", engine=engine)
    x, y = rank_data(engine.rank)
    if engine.size == 1:
        return
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[callback])
    except ModelMismatchError as exc:
        assert f"rank {engine.size - 1} holds a different model" in str(exc) and "bias" in str(exc), exc
    else:
        raise AssertionError("a rank with another model went unnoticed")


def case_keras_keeps_asynchronous_batch_dispatch(engine: Engine) -> None:
    """The callback never overrides on_train_batch_end, so Keras still dispatches batch ends asynchronously where
    the backend allows it (``_async_train`` is Keras' own flag, read here to see the effect)."""

    class Overriding(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None) -> None:
            pass

    def dispatch(callbacks) -> bool:
        return keras.callbacks.CallbackList(callbacks)._async_train

    assert dispatch([fast.Callback("dpsgd:ring", engine=engine)]) == dispatch([])
    assert not dispatch([Overriding()])
    if keras.backend.backend() in ("jax", "torch"):
        assert dispatch([]), "this backend was expected to dispatch batch ends asynchronously"


def case_a_budget_is_spent_exactly_in_whole_batches_and_ends_every_fit(engine: Engine) -> None:
    """fast_tf.budget on every backend: claims one batch ahead, Keras stops before an ungranted batch; a budget
    spent before the first batch leaves the model as it started (test_keras_budget.py has the slow-rank runs)."""
    x, y = rank_data(engine.rank)

    def budgeted(budget: Budget) -> tuple[keras.Model, fast.Callback]:
        model = make_model(engine, keras.optimizers.SGD(LR))
        callback = fast.Callback("async:ring", engine=engine, batch_size=BATCH, budget=budget, average_at_end=False)
        data = fast.Batches(x, y, batch_size=BATCH, seed=engine.rank)
        model.fit(data, steps_per_epoch=STEPS, epochs=100, shuffle=False, verbose=0, callbacks=[callback])
        return model, callback

    model, callback = budgeted(Budget(samples=BATCH * 5 * engine.size))
    worker = callback.worker
    assert worker.metrics.job_samples == BATCH * 5 * engine.size, worker.metrics.job_samples
    assert worker.metrics.samples == BATCH * worker.step == BATCH * int(model.optimizer.iterations.numpy())
    start = make_model(engine, keras.optimizers.SGD(LR)).get_weights()
    model, callback = budgeted(Budget(seconds=1e-9))  # over at the first claim: Keras' one batch is put back
    assert (callback.worker.step, callback.worker.metrics.job_samples) == (0, 0)
    assert int(model.optimizer.iterations.numpy()) == 0
    first = np.concatenate([w.reshape(-1) for w in start]).astype(np.float64)
    if engine.rank != 0:
        first[:] = 0.0
    engine.allreduce(first)  # rank 0's start, which the callback gave every rank
    np.testing.assert_array_equal(flat_weights(model), first)


def case_checkpoint_round_trip(engine: Engine) -> None:
    """fast_tf.save_checkpoint after a fit, then Callback(resume_from=...) on a fresh model: every rank starts its
    next fit from the ranks' mean model and optimizer variables, at the saved step (this backend's variables)."""
    folder = engine.broadcast_text(tempfile.mkdtemp(prefix="fast-keras-ckpt-") if engine.rank == 0 else "")
    path = os.path.join(folder, "job.ckpt")
    model, callback = fit(engine, "dpsgd:ring", keras.optimizers.SGD(LR, momentum=0.9))
    fast.save_checkpoint(path, callback)
    mean = flat_weights(model)
    engine.allreduce(mean)
    mean /= engine.size
    momenta = np.concatenate([np.asarray(v.numpy(), dtype=np.float64).reshape(-1) for v in model.optimizer.variables])
    engine.allreduce(momenta)
    momenta /= engine.size
    seen = {}

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None) -> None:
            variables = self.model.optimizer.variables
            seen["params"] = flat_weights(self.model)
            seen["optimizer"] = np.concatenate([np.asarray(v.numpy(), np.float64).reshape(-1) for v in variables])
            seen["step"] = resumed.worker.step

    fresh = make_model(engine, keras.optimizers.SGD(LR, momentum=0.9))
    fresh.set_weights(initial_weights(50 + engine.rank))
    resumed = fast.Callback("dpsgd:ring", engine=engine, average_at_end=False, resume_from=path)
    x, y = rank_data(engine.rank)
    fresh.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[resumed, Probe()])
    np.testing.assert_allclose(seen["params"], mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(seen["optimizer"], momenta, rtol=1e-6, atol=1e-6)
    assert seen["step"] == TOTAL_STEPS and resumed.worker.step == TOTAL_STEPS + STEPS
    engine.barrier()
    if engine.rank == 0:
        shutil.rmtree(folder)


CASES = {name: fn for name, fn in sorted(globals().items()) if name.startswith("case_") and callable(fn)}


def main(patterns: list[str]) -> None:
    engine = mpi_engine(timeout=120)
    chosen = [name for name in CASES if not patterns or any(p in name for p in patterns)]
    for name in chosen:
        start = time.perf_counter()
        CASES[name](engine)
        engine.barrier()
        if engine.rank == 0:
            print(f"{name} ok ({time.perf_counter() - start:.2f} s)", flush=True)
    if engine.rank == 0:
        print(
            f"keras cases on the {keras.backend.backend()} backend, {engine.size} ranks: {len(chosen)} passed",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
