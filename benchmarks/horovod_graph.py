"""What a Horovod collective costs inside ``tf.function`` against the same call run eagerly (issue 26: at most 1.2x
at 1 MB): ``fast_tf.horovod.allreduce`` of one float32 tensor, per call, the two forms interleaved round by round,
medians of the rounds. Inside a graph the host collective runs as ``tf.numpy_function`` (adapters/tf/horovod/graph.py).

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py benchmarks/horovod_graph.py --megabytes 1 --calls 50 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fast_tf.horovod as hvd  # noqa: E402


def per_call(run, tensor: tf.Tensor, calls: int) -> float:
    """Seconds per call of ``run(tensor)``, its result read back each time (as a training loop uses it)."""
    hvd.allreduce(tf.constant(0.0))  # start together
    began = time.perf_counter()
    for _ in range(calls):
        run(tensor).numpy()
    return (time.perf_counter() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=1.0)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hvd.init()
    tensor = tf.constant(np.random.default_rng(hvd.rank()).normal(size=int(args.megabytes * 2**20 / 4)), tf.float32)
    eager, graph = hvd.allreduce, tf.function(hvd.allreduce)
    graph(tensor)  # traced once, before timing
    times: dict[str, list[float]] = {"eager": [], "tf.function": []}
    for _ in range(args.rounds):  # interleaved: both forms see the same machine
        times["eager"].append(per_call(eager, tensor, args.calls))
        times["tf.function"].append(per_call(graph, tensor, args.calls))
    if hvd.rank() == 0:
        eager_ms, graph_ms = (statistics.median(times[k]) * 1e3 for k in ("eager", "tf.function"))
        print(
            f"allreduce of {args.megabytes:g} MB on {hvd.size()} ranks, medians of {args.rounds} rounds of "
            f"{args.calls} calls: eager {eager_ms:.3f} ms, tf.function {graph_ms:.3f} ms, "
            f"ratio {graph_ms / eager_ms:.2f}"
        )
        print("rounds (ms): " + "; ".join(f"{k} " + ", ".join(f"{t * 1e3:.3f}" for t in v) for k, v in times.items()))


if __name__ == "__main__":
    main()
