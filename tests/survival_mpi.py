"""Run under Open MPI with ULFM: ``mpiexec --with-ft ulfm -n 4 python -m mpi4py tests/survival_mpi.py STRATEGY
VICTIMS OUT [SAMPLES]``. Softmax regression on the digits, a shared sample budget; each rank in VICTIMS (launch
numbers with the step at which each kills itself with SIGKILL, e.g. ``2@30,1@60``; ``2@start`` before the
Worker's start) dies there, and the survivors
go on. Every survivor writes ``OUT/rank<launch number>.json``: what it saw, for tests/test_survival_mpi.py and
benchmarks/chaos.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from fast_core import Budget, Worker
from fast_core.data.datasets import batches, example_task, shard_indices
from fast_core.engine.mpi_ft import FaultTolerantMPIEngine
from fast_core.model.numpy_model import SoftmaxRegression

BATCH = 32


BEFORE_START = -1
"""The step of a victim that dies before the Worker's start (``2@start``), while the others are in it."""


def victims(text: str) -> dict[int, int]:
    """``2@30,1@60`` -> {2: 30, 1: 60}; ``2@start`` -> {2: BEFORE_START}; ``-`` for none."""
    if text in ("", "-"):
        return {}
    items = (item.split("@") for item in text.split(","))
    return {int(rank): BEFORE_START if step == "start" else int(step) for rank, step in items}


def die(out: Path, me: int, step: int) -> None:
    """SIGKILL this process, first saying when (``OUT/killed<me>.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"killed{me}.json").write_text(json.dumps({"at": time.time(), "step": step}))
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    strategy, doomed, out = sys.argv[1], victims(sys.argv[2]), Path(sys.argv[3])
    samples = int(sys.argv[4]) if len(sys.argv) > 4 else 20_000
    engine = FaultTolerantMPIEngine(
        timeout=float(os.environ.get("FAST_TIMEOUT", "60")), max_restarts=int(os.environ.get("FAST_MAX_RESTARTS", "0"))
    )
    replacement = bool(engine.joined)
    if replacement:
        doomed = {}  # a replacement does not die again where its predecessor did
    me = engine.world_ranks[engine.rank]  # a replacement takes the number of the rank it replaces
    task = example_task("digits")
    x, y = task.train
    shard = shard_indices(len(y), engine.rank, engine.size)
    model = SoftmaxRegression(x.shape[1], 10, seed=me)
    worker = Worker(model, strategy, engine, observers=[], budget=Budget(samples=samples))
    if doomed.get(me) == BEFORE_START:
        time.sleep(0.5)  # the others are in the start's collectives by then
        die(out, me, BEFORE_START)
    worker.start()
    started = time.time()
    epoch = 0
    while True:
        for xb, yb in batches(x[shard], y[shard], BATCH, epoch=epoch, seed=me):
            if doomed.get(me) == worker.step:
                die(out, me, worker.step)
            granted = worker.claim_batch(BATCH)
            if granted == 0:
                break
            model.compute_gradients(xb[:granted], yb[:granted])
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        else:
            epoch += 1
            continue
        break
    worker.close()
    consensus = worker.group.average_params()
    accuracy = model.accuracy(*task.test, params=consensus)
    record = {
        "rank": engine.rank,
        "launched_as": me,
        "replacement": replacement,
        "size": engine.size,
        "steps": worker.step,
        "samples": worker.metrics.samples,
        "job_samples": worker.metrics.job_samples,
        "accuracy": accuracy,
        "finite": bool(np.all(np.isfinite(model.params()))),
        "seconds": time.time() - started,
        "recoveries": [recovery.as_record() for recovery in worker.group.recoveries],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{me}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
