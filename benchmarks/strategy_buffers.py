"""Which model-sized buffers each strategy keeps, and where they are allocated: the "why" behind at_scale's memory.

    python benchmarks/strategy_buffers.py                         # every strategy of benchmarks/at_scale.py
    python benchmarks/strategy_buffers.py async:ring fast:ring    # some

Two ranks in one process (``LocalCluster``), a 1M-parameter float32 model (a softmax regression), 6 steps of each
strategy; NumPy allocations are traced (``tracemalloc``) from before the Worker starts to after its last step, and
every allocation still held that is at least a quarter of the model is printed with the line of FAST that made it,
in model copies per rank. The in-process engine's own message copies (``engine/local.py``; MPI holds none of them
once a message is received) are left out. at_scale.py measures the same on real processes, as resident memory.
"""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np

from fast_core import LocalCluster, Worker
from fast_core.model.numpy_model import SoftmaxRegression

FEATURES, CLASSES = 100_000, 10
MODEL_BYTES = (FEATURES * CLASSES + CLASSES) * 4
STRATEGIES = [
    "allreduce",
    "localsgd",
    "dpsgd:ring",
    "async:ring",
    "sgp",
    "gossip",
    "adpsgd:ring",
    "easgd",
    "fast:ring",
    "ps:servers=1",
    "diloco",
    "choco:ring",
]


def _train(engine, strategy: str, snapshots: dict) -> None:
    model = SoftmaxRegression(FEATURES, CLASSES, seed=engine.rank, dtype="float32")
    x = np.random.default_rng(engine.rank).normal(size=(4, FEATURES)).astype(np.float32)
    y = np.arange(4) % CLASSES
    model.compute_gradients(x, y)
    model.optimizer_step()  # the optimizer's own state exists before the first snapshot
    engine.barrier()
    if engine.rank == 0:
        snapshots["before"] = tracemalloc.take_snapshot()
    engine.barrier()
    worker = Worker(model, strategy, engine, observers=[]).start()
    for _ in range(6):
        model.compute_gradients(x, y)
        worker.run_step(model.optimizer_step)
    engine.barrier()
    if engine.rank == 0:
        snapshots["after"] = tracemalloc.take_snapshot()
    engine.barrier()
    worker.close()


def _site(trace: tracemalloc.Traceback) -> str:
    """The innermost frames of FAST that made the allocation (the strategy's line last)."""
    frames = [f for f in trace if "fast_core" in f.filename]
    return " <- ".join(f"{f.filename.split('fast_core/')[-1]}:{f.lineno}" for f in reversed(frames[-3:]))


def buffers(strategy: str) -> list[tuple[float, str]]:
    """(model copies per rank, allocation site) of what ``strategy`` holds after 6 steps, largest first."""
    snapshots: dict[str, tracemalloc.Snapshot] = {}
    LocalCluster(2, timeout=60).run(_train, strategy, snapshots)
    held = []
    for stat in snapshots["after"].compare_to(snapshots["before"], "traceback"):
        site = _site(stat.traceback)
        if stat.size_diff >= MODEL_BYTES / 4 and not site.startswith("engine/local.py"):  # not a message copy
            held.append((stat.size_diff / MODEL_BYTES / 2, site))
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("strategies", nargs="*", default=STRATEGIES)
    args = parser.parse_args()
    tracemalloc.start(12)
    for strategy in args.strategies:
        held = buffers(strategy)
        print(f"{strategy}: {sum(c for c, _ in held):.1f} model copies per rank")
        for copies, site in held:
            print(f"  {copies:4.1f}  {site}")


if __name__ == "__main__":
    main()
