"""``fast model --calibrate``: the machine's figures, measured in a few seconds rather than taken from a data sheet.

- peak flop rate: a float64 GEMM of 256 x 256 matrices in NumPy (one core: OMP_NUM_THREADS as set);
- memory bandwidth: a 32 MB ``np.copyto`` (read and write counted);
- link latency and bandwidth: a ping-pong of 8 bytes and 1 MB between two ranks over FAST's MPI engine under the
  ``mpiexec`` next to this Python (the ranks of a job on this machine talk that way), or, where there is none,
  between two threads of this process (LocalCluster; said in ``Machine.measured``);
- with ``ranks_per_machine`` > 1: how much slower that many processes compute at once than one alone;
- the framework's own time per step: ``ranks_per_machine`` ranks (at least 2) training a 2-parameter model with
  all-reduce (the hooks, Python, and the ranks meeting once a step, which costs more when they share cores), and
  a 100,100-parameter one: what its step takes beyond that and beyond the all-reduce the links predict is the
  framework's time per parameter byte (gradient copies, checks, reductions: passes over memory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fast_core.perfmodel.machine import Machine

__all__ = ["calibrate", "ping_pong"]

_SIZES = (8, 1 << 20)


def _best(run: Callable[[], None], repeats: int = 5) -> float:
    """The fastest of ``repeats`` timed runs (what the hardware can do, not what the neighbours left)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def gemm_rate(n: int = 256) -> float:
    a, b = np.random.default_rng(0).random((2, n, n))
    return 2 * n**3 / _best(lambda: a @ b)


def copy_rate(nbytes: int = 32 << 20) -> float:
    source, target = np.ones(nbytes // 8), np.empty(nbytes // 8)
    return 2 * nbytes / _best(lambda: np.copyto(target, source))


PROBE_FEATURES = 1000
"""The larger probe model: softmax regression of 1,000 features x 100 classes (100,100 parameters, 0.8 MB)."""


def step_seconds(engine, features: int, steps: int) -> float:
    """Seconds of a Worker's step of softmax regression (``features`` x 100) under all-reduce, on one sample."""
    from fast_core.config.run import RunConfig
    from fast_core.model.numpy_model import SoftmaxRegression
    from fast_core.runtime.worker import Worker

    model = SoftmaxRegression(features, 100 if features > 1 else 2)
    worker = Worker(model, "allreduce", engine, config=RunConfig()).start()
    x, y = np.ones((1, features)), np.zeros(1, dtype=np.int64)

    def loop() -> None:
        for _ in range(steps):
            model.compute_gradients(x, y)
            worker.before_step()
            model.optimizer_step()
            worker.after_step()

    seconds = _best(loop, 3) / steps
    worker.close()
    return seconds


def _measure(engine) -> dict[str, float]:
    """Every rank's part: the ping-pong, then a step of a 2-parameter and of a 100,100-parameter model."""
    found = {str(size): seconds for size, seconds in ping_pong(engine).items()}
    found["small"] = step_seconds(engine, 1, 300)
    found["large"] = step_seconds(engine, PROBE_FEATURES, 100)
    found["ranks"] = engine.size
    return found




def ping_pong(engine, repeats: int = 20) -> dict[int, float]:
    """Half the median round trip of each size between ranks 0 and 1 (every rank must call it; the others wait):
    the median, not the best, because a training step meets the links as they usually are, caches cold."""
    found = {}
    for size in _SIZES:
        buf = np.zeros(size, dtype=np.uint8)
        times = []
        for _ in range(repeats):
            engine.barrier()
            start = time.perf_counter()
            if engine.rank == 0:
                engine.wait(engine.isend(buf, 1))
                engine.wait(engine.irecv(buf, 1))
            elif engine.rank == 1:
                engine.wait(engine.irecv(buf, 0))
                engine.wait(engine.isend(buf, 0))
            times.append(time.perf_counter() - start)
        found[size] = float(np.median(times)) / 2
    return found


def _links_from(found: dict[str, float]) -> tuple[float, float, float, float]:
    """Latency, bandwidth, the fixed step overhead and the overhead per parameter byte: the larger probe's step
    beyond the smaller one's and beyond the all-reduce the links predict (copies, checks, reductions in memory)."""
    from fast_core.simulate.links import LinkModel

    small, large = _SIZES
    latency = found[str(small)]
    bandwidth = (large - small) / max(found[str(large)] - latency, 1e-12)
    nbytes = (PROBE_FEATURES * 100 + 100) * 8
    allreduce = LinkModel(bandwidth, latency).allreduce_seconds(nbytes, int(found["ranks"]))
    per_byte = max(0.0, found["large"] - found["small"] - allreduce) / nbytes
    return latency, bandwidth, found["small"], per_byte


def measure_pair(ranks: int = 2) -> tuple[float, float, float, float, str]:
    """Latency and bandwidth between two ranks and the step overhead of ``ranks`` ranks meeting every step (ranks
    that share cores wait for each other's turn), and how they were measured."""
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if mpiexec is not None:
        command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "fast_core.perfmodel.calibrate"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return (*_links_from(json.loads(done.stdout.strip().splitlines()[-1])), f"{ranks} MPI ranks under mpiexec")
    from fast_core.engine.local import LocalCluster

    return (*_links_from(LocalCluster(ranks).run(_measure)[0]), f"{ranks} threads of one process (no mpiexec)")


def _workload(seconds: float = 1.0) -> float:
    """Rounds per second of a training-like NumPy round (a GEMM, an elementwise pass, a reduction) for ``seconds``."""
    a = np.random.default_rng(0).random((128, 512))
    w = np.random.default_rng(1).random((512, 256))
    rounds, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        np.maximum(a @ w, 0.0).sum(axis=0)
        rounds += 1
    return rounds / elapsed


def sharing_factor(ranks: int) -> float:
    """How much slower each of ``ranks`` processes computes when they all run at once on this machine than one
    alone: measured, because cores shared by hyper-threads, caches and quotas make it more than ranks / cores
    (4 processes on this project's 2 cores: 3.7x, not 2x)."""
    if ranks <= 1:
        return 1.0
    command = [sys.executable, "-c", "from fast_core.perfmodel.calibrate import _workload; print(_workload())"]
    alone = float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    together = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(ranks)]
    rates = [float(process.communicate()[0]) for process in together]
    return max(1.0, alone / (sum(rates) / len(rates)))


def calibrate(dtype_bytes: int = 8, ranks_per_machine: int = 1) -> Machine:
    """Measure this machine; ``ranks_per_machine`` > 1 also measures how much slower that many ranks compute."""
    latency, bandwidth, overhead, per_byte, how = measure_pair(max(2, ranks_per_machine))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return Machine(
        peak_flops=gemm_rate(),
        memory_bandwidth=copy_rate(),
        latency=latency,
        bandwidth=bandwidth,
        step_overhead=overhead,
        step_overhead_per_byte=per_byte,
        cores=cores,
        dtype_bytes=dtype_bytes,
        sharing={str(ranks_per_machine): sharing_factor(ranks_per_machine)} if ranks_per_machine > 1 else {},
        measured=f"fast model --calibrate on {time.strftime('%Y-%m-%d')}: links between {how}",
    )


if __name__ == "__main__":  # one rank of measure_links' ping-pong
    from fast_core.engine.mpi import MPIEngine

    engine = MPIEngine()
    measured = _measure(engine)
    if engine.rank == 0:
        print(json.dumps(measured))
