"""The shared training task of the multi-rank cases: a NumPy softmax model on synthetic data, 4 shards.

``train`` runs a strategy through the Worker hooks exactly as an adapter would; ``reference_dpsgd`` is the
dense-matrix NumPy simulation the decentralized strategies are checked against.
"""

from __future__ import annotations

import time

import numpy as np

from fast_core import Worker
from fast_core.data.datasets import shard_indices, synthetic_classification
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.topology import make_topology

FEATURES, CLASSES, BATCH, LR = 20, 4, 32, 0.2


def task(size: int):
    x, y = synthetic_classification(n_samples=2400, n_features=FEATURES, n_classes=CLASSES, seed=3, noise=3.0)
    test = slice(2000, None)
    shards = [shard_indices(2000, r, size, seed=1) for r in range(size)]
    return x, y, shards, (x[test], y[test])


def batch(x, y, shard, step):
    start = (step * BATCH) % (len(shard) - BATCH)
    idx = shard[start : start + BATCH]
    return x[idx], y[idx]


def train(engine: Engine, strategy, steps: int, seed: int = 0, optimizer=None, pause=None):
    """Train ``steps`` steps through the Worker hooks, as an adapter would; ``pause`` (seconds, or a function of
    the step) stands in for a real model's compute time."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=optimizer or SGD(LR), seed=seed + engine.rank)
    worker = Worker(model, strategy, engine).start()
    for step in range(steps):
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        if pause is not None:
            time.sleep(pause(step) if callable(pause) else pause)
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    return model, worker


def steps_in_window(engine: Engine, strategy, slow_rank: int, slowdown: float, step_time=0.004, window=1.0):
    """Every rank's number of steps done in ``window`` seconds, ``slow_rank`` computing ``slowdown`` times longer."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.1), seed=0)
    worker = Worker(model, strategy, engine).start()
    engine.barrier()
    stop = time.perf_counter() + window
    while time.perf_counter() < stop:
        model.compute_gradients(*batch(x, y, shards[engine.rank], worker.step))
        time.sleep(step_time * (slowdown if engine.rank == slow_rank else 1))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    counts = np.zeros(engine.size)
    counts[engine.rank] = worker.step
    engine.allreduce(counts)
    return counts


def reference_mean_gradient(size: int, steps: int, optimizer=None) -> np.ndarray:
    """One model (rank 0's start) trained on the mean gradient of all ``size`` shards: what all-reduce and the
    synchronous parameter server give every worker."""
    x, y, shards, _ = task(size)
    single = SoftmaxRegression(FEATURES, CLASSES, optimizer=optimizer or SGD(LR), seed=0)
    for step in range(steps):
        grads = []
        for r in range(size):
            single.compute_gradients(*batch(x, y, shards[r], step))
            grads.append(single.grads().copy())
        single.apply_gradient(np.mean(grads, axis=0))
    return single.params().copy()


def reference_dpsgd(size: int, topology: str, steps: int, sent=None) -> np.ndarray:
    """Dense-matrix NumPy simulation of D-PSGD: X <- W(k) X - lr * G(X), all workers from rank 0's start.

    ``sent(x)``: what a neighbour receives of a worker's parameters (a codec's round trip); each worker mixes its own
    exact values and its neighbours' sent ones."""
    x, y, shards, _ = task(size)
    models = [SoftmaxRegression(FEATURES, CLASSES, seed=0) for _ in range(size)]
    states = np.stack([models[0].params().copy() for _ in range(size)])
    graph = make_topology(topology, size)
    for step in range(steps):
        grads = []
        for r, m in enumerate(models):
            m.set_params(states[r])
            m.compute_gradients(*batch(x, y, shards[r], step))
            grads.append(m.grads().copy())
        w = graph.mixing_matrix(step)
        if sent is None:
            states = w @ states - LR * np.stack(grads)
        else:
            received = np.stack([sent(s) for s in states]).astype(np.float64)
            own = np.diag(w)[:, None] * states
            states = own + (w - np.diag(np.diag(w))) @ received - LR * np.stack(grads)
    return states
