"""A Horovod elastic script in NumPy (no framework), with FAST's import only, for the tests of ``hvd.elastic``:

    fast run --fault-tolerant [--max-restarts K] -n 4 tests/horovod_elastic_script.py OUT [RANK@EPOCH.BATCH]

Linear regression by mini-batch SGD in an ``hvd.elastic.ObjectState`` (the weights an array, the epoch and batch
numbers plain values), committed every BATCHES_PER_COMMIT batches. Each step's global batch (fixed rows, split over
the ranks) is reduced exactly (the sum of the gradients and of the row counts over ranks), so the weights after
EPOCHS epochs do not depend on how many ranks trained, only on every step being applied once: ``reference()``
computes them in one process. Rank RANK (a launch number) kills itself with SIGKILL at the start of that batch,
once (a replacement started by ``--max-restarts`` does not die again). Every rank that finishes writes
``OUT/rank<launch number>.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import fast_core
import fast_core.interop.horovod as hvd  # instead of: import horovod.torch as hvd
from fast_core.engine import Engine
from fast_core.engine.capabilities import joining, world_ranks
from fast_core.engine.collectives import sum_arrays

EPOCHS, BATCHES, ROWS, FEATURES, LR, BATCHES_PER_COMMIT = 3, 8, 24, 5, 0.05, 2
"""ROWS: the global batch of a step, split over the ranks (24 splits evenly over 1, 2, 3 and 4 ranks). A commit
every 2 batches: a rank lost at an odd batch makes the survivors undo the batch before (``restore``)."""


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((EPOCHS * BATCHES * ROWS, FEATURES))
    y = x @ np.arange(1.0, FEATURES + 1) + 0.1 * rng.standard_normal(len(x))
    return x, y


def rows(epoch: int, batch: int) -> np.ndarray:
    """The rows of step (epoch, batch): a permutation per epoch, cut into batches."""
    order = np.random.default_rng(100 + epoch).permutation(EPOCHS * BATCHES * ROWS)
    return order[batch * ROWS : (batch + 1) * ROWS]


def gradient_sum(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 2.0 * x.T @ (x @ w - y)


def reference() -> np.ndarray:
    """The weights one process computes: every step once, on its whole global batch."""
    x, y = data()
    w = np.zeros(FEATURES)
    for epoch in range(EPOCHS):
        for batch in range(BATCHES):
            take = rows(epoch, batch)
            w -= LR * gradient_sum(w, x[take], y[take]) / len(take)
    return w


def train_job(engine: Engine, victim: tuple[int, int, int] | None, die: Callable[[], None]) -> dict:
    """The script's body on ``engine``'s rank; ``victim``: (launch number, epoch, batch) that calls ``die``."""
    x, y = data()
    me = world_ranks(engine)[engine.rank]
    replacement = bool(joining(engine))
    resets: list[int] = []

    state = hvd.elastic.ObjectState(fast_engine=engine, w=np.zeros(FEATURES), epoch=0, batch=0)
    state.register_reset_callbacks([lambda: resets.append(engine.size)])  # e.g. rescale the learning rate

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> None:
        for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 - Horovod's own loop
            for batch in range(state.batch, BATCHES):
                if victim is not None and not replacement and (me, state.epoch, batch) == victim:
                    die()
                take = rows(state.epoch, batch)[engine.rank :: engine.size]
                total, count = sum_arrays(
                    [gradient_sum(state.w, x[take], y[take]), np.array([len(take)], dtype=np.float64)], engine
                )
                state.w -= LR * total / count[0]
                state.batch = batch + 1
                if state.batch % BATCHES_PER_COMMIT == 0:
                    state.commit()
            state.batch = 0

    train(state)
    return {
        "launch": me,
        "rank": engine.rank,
        "size": engine.size,
        "epoch": state.epoch,
        "w": state.w.tolist(),
        "resets": resets,
        "replacement": replacement,
    }


def main() -> None:
    out = Path(sys.argv[1])
    victim = None
    if len(sys.argv) > 2:
        launch, _, when = sys.argv[2].partition("@")
        epoch, _, batch = when.partition(".")
        victim = (int(launch), int(epoch), int(batch))
    hvd.init()
    engine = fast_core.init()  # the engine hvd.init() started
    marker = out / "killed.json"

    def die() -> None:
        if marker.exists():  # once: a new process that took the rank's place does not die again
            return
        marker.write_text(json.dumps({"launch": victim[0], "epoch": victim[1], "batch": victim[2]}))
        os.kill(os.getpid(), signal.SIGKILL)

    result = train_job(engine, victim, die)
    (out / f"rank{result['launch']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
