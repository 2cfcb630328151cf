"""One strategy, three frameworks, one answer: D-PSGD on a ring through fast_torch, fast_tf and fast_jax, against NumPy.

    KERAS_BACKEND=tensorflow OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/tf_adapter/cross_framework.py

Every rank trains the same softmax regression (logits = x @ W + b, mean cross-entropy) for 20 steps of plain SGD
with "dpsgd:ring", once with each framework's public API as a user would write it: a torch.optim.SGD wrapped in
fast_torch.DistributedOptimizer, Keras ``model.fit`` with fast_tf.Callback (shuffle=False), and a jitted optax step
wrapped by fast_jax.distributed. Each rank starts from its own weights (the adapters must hand everyone rank 0's)
and fits its own fixed batches in a fixed order, all float32. The final parameters of every rank are compared
with each other and with ``reference_dpsgd`` (tests/training.py), the float64 dense-matrix simulation X <- W X -
lr G(X) that checks the NumPy path, so the reference knows nothing of the adapters.

Rank 0 prints one line per framework with its largest differences and a final ``N passed, M failed`` line; a
failure raises on every rank, so ``python -m mpi4py`` aborts the job (exit code != 0). Only the TensorFlow Keras
backend is run: JAX and torch are already covered directly, by fast_jax and fast_torch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import torch

import fast_jax
import fast_tf
import fast_torch
from fast_core import Engine, mpi_engine
from fast_core.model.numpy_model import SoftmaxRegression

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared task and its NumPy reference
from training import BATCH, CLASSES, FEATURES, LR, batch, reference_dpsgd, task  # noqa: E402

STRATEGY, TOPOLOGY, STEPS = "dpsgd:ring", "ring", 20
# float32 training against a float64 reference, so the differences are rounding only. Measured (the same in 3 launches,
# 4 ranks): at most 7.8e-8 from the reference and 8.9e-8 between frameworks, on parameters of magnitude up to 0.41
# (one float32 ulp there is 3e-8). ATOL leaves 10x room for other CPUs' kernels and is still four orders of
# magnitude below the errors it must catch: mixing after the local step, W (X - lr G), ends 0.037 away from the
# reference, and no mixing at all 0.11 (same task, NumPy).
RTOL, ATOL = 0.0, 1e-6

Params = tuple[np.ndarray, np.ndarray]  # (W: features x classes, b: classes), float32


def rank_data(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's STEPS batches of the shared task, concatenated in order, so each framework fits them unshuffled."""
    x, y, shards, _ = task(size)
    xs, ys = zip(*(batch(x, y, shards[rank], step) for step in range(STEPS)), strict=True)
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.int64)


def initial_params(rank: int) -> Params:
    """SoftmaxRegression(seed=rank)'s start, in float32: rank 0's is the reference's, the others differ, so the
    adapters' start-up broadcast is part of what is checked."""
    model = SoftmaxRegression(FEATURES, CLASSES, seed=rank)
    return model.weight.astype(np.float32), model.bias.astype(np.float32)


def flat(weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """W then b, row-major: the layout of SoftmaxRegression's buffer, hence of the reference's rows."""
    return np.concatenate([np.asarray(weight).reshape(-1), np.asarray(bias).reshape(-1)]).astype(np.float64)


def batches(x: np.ndarray, y: np.ndarray):
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        yield x[rows], y[rows]


# the three trainings: each returns this rank's final parameters (flat) and the steps its Worker counted -----------
def train_torch(engine: Engine, x: np.ndarray, y: np.ndarray, start: Params) -> tuple[np.ndarray, int]:
    model = torch.nn.Linear(FEATURES, CLASSES)  # computes x @ weight.T + bias: weight is W transposed
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(start[0].T.copy()))
        model.bias.copy_(torch.from_numpy(start[1]))
    optimizer = fast_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR), model, STRATEGY, engine=engine
    )
    for xb, yb in batches(x, y):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(xb)), torch.from_numpy(yb)).backward()
        optimizer.step()
    worker = optimizer.fast_worker
    worker.close()
    return flat(model.weight.detach().numpy().T, model.bias.detach().numpy()), worker.metrics.steps


def train_keras(engine: Engine, x: np.ndarray, y: np.ndarray, start: Params) -> tuple[np.ndarray, int]:
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
    model.set_weights(list(start))
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = fast_tf.Callback(STRATEGY, engine=engine, average_at_end=False)  # each rank keeps its own replica
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    kernel, bias = model.get_weights()
    return flat(kernel, bias), callback.worker.metrics.steps


def train_jax(engine: Engine, x: np.ndarray, y: np.ndarray, start: Params) -> tuple[np.ndarray, int]:
    optimizer = optax.sgd(LR)

    def loss(params: dict, xb: jax.Array, yb: jax.Array) -> jax.Array:
        logits = xb @ params["W"] + params["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    @jax.jit
    def train_step(params: dict, opt_state, data: tuple) -> tuple:
        value, grads = jax.value_and_grad(loss)(params, *data)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": value}

    step = fast_jax.distributed(train_step, STRATEGY, engine=engine)
    params = {"W": jnp.asarray(start[0]), "b": jnp.asarray(start[1])}
    opt_state = optimizer.init(params)
    for xb, yb in batches(x, y.astype(np.int32)):  # int32: JAX's default integer without x64
        params, opt_state, _ = step(params, opt_state, (jnp.asarray(xb), jnp.asarray(yb)))
    step.close()
    return flat(params["W"], params["b"]), step.worker.metrics.steps


FRAMEWORKS: dict[str, Callable[[Engine, np.ndarray, np.ndarray, Params], tuple[np.ndarray, int]]] = {
    "torch": train_torch,
    "keras": train_keras,
    "jax": train_jax,
}


def gather(engine: Engine, row: np.ndarray) -> np.ndarray:
    """Every rank's ``row`` (size x P) on every rank: one sum-allreduce of a zero-padded buffer, exact in float64."""
    rows = np.zeros((engine.size, row.size))
    rows[engine.rank] = row
    engine.allreduce(rows)
    return rows


def main() -> None:
    torch.set_num_threads(1)
    engine = mpi_engine(timeout=120)
    say = print if engine.rank == 0 else (lambda *a, **k: None)
    say(
        f"{STRATEGY}, {STEPS} steps of SGD (lr {LR}), {engine.size} ranks: torch {torch.__version__}, keras "
        f"{keras.__version__} on the {keras.backend.backend()} backend, jax {jax.__version__}",
        flush=True,
    )
    x, y = rank_data(engine.rank, engine.size)
    start = initial_params(engine.rank)

    results: dict[str, np.ndarray] = {}
    steps: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    for name, train in FRAMEWORKS.items():
        began = time.perf_counter()
        params, counted = train(engine, x, y, start)
        seconds[name] = time.perf_counter() - began
        results[name] = gather(engine, params)
        steps[name] = gather(engine, np.array([float(counted)]))[:, 0]

    reference = reference_dpsgd(engine.size, TOPOLOGY, steps=STEPS)
    spread = np.abs(reference - reference.mean(axis=0)).max()
    say(
        f"reference: largest |parameter| {np.abs(reference).max():.3g}, ranks differ from their mean by up to "
        f"{spread:.3g}; tolerance atol {ATOL:g}, rtol {RTOL:g}",
        flush=True,
    )

    failures: list[str] = []
    for name, params in results.items():
        problems = []
        if not np.all(steps[name] == STEPS):
            problems.append(f"steps counted {steps[name].astype(int).tolist()}")
        against = {"reference": reference, **{other: results[other] for other in results if other != name}}
        diffs = {}
        for other, values in against.items():
            diffs[other] = float(np.abs(params - values).max())
            if not np.allclose(params, values, rtol=RTOL, atol=ATOL):
                problems.append(f"differs from {other}")
        verdict = "ok" if not problems else "FAILED: " + ", ".join(problems)
        listing = ", ".join(f"vs {other} {diff:.2e}" for other, diff in diffs.items())
        say(f"{name}: max abs diff {listing} ({seconds[name]:.1f} s) {verdict}", flush=True)
        if problems:
            failures.append(name)

    # rank 0 decides for all, so every rank raises (or none does)
    failed = np.array([len(failures)], dtype=np.int64)
    engine.broadcast(failed, 0)
    say(f"{len(FRAMEWORKS) - int(failed[0])} passed, {int(failed[0])} failed", flush=True)
    if failed[0]:
        raise AssertionError(f"D-PSGD through {failures or 'some frameworks'} disagrees (see rank 0's lines)")


if __name__ == "__main__":
    main()
