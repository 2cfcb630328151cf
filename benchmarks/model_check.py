"""`fast model` against measured steps: its prediction beside the time a real job's step takes here.

Each strategy trains the NumPy MLP (digits, 64-H-10) on N ranks under mpiexec for a few hundred steps, as
examples/numpy_digits.py does (the Worker, the strategy, the optimizer), and reports the job's wall-clock per step
(from a barrier to the last rank's end, over the steps after a warm-up). The prediction uses a machine calibrated
first (`fast model --calibrate`: GEMM rate, copy bandwidth, the framework's own time per step, a ping-pong between
two ranks) and the model's layers; nothing is fitted to the runs.

    OMP_NUM_THREADS=1 python benchmarks/model_check.py            # about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

STRATEGIES = ("allreduce", "dpsgd:ring", "async:ring", "ps:servers=2", "localsgd:period=4", "gossip")


def worker(args: argparse.Namespace) -> None:
    import fast_core
    from fast_core.config.run import RunConfig
    from fast_core.data.datasets import digits
    from fast_core.model.numpy_model import MLP, SGD

    engine = fast_core.init()
    x, y = digits()
    model = MLP(64, args.hidden, 10, optimizer=SGD(0.05), seed=engine.rank)
    worker = fast_core.Worker(model, args.strategy, engine, config=RunConfig()).start()
    rng = np.random.default_rng(engine.rank)

    def step() -> None:
        chosen = rng.integers(0, len(y), args.batch)
        model.compute_gradients(x[chosen], y[chosen])
        worker.before_step()
        model.optimizer_step()
        worker.after_step()

    for _ in range(args.warmup):
        step()
    engine.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    worker.close()
    engine.barrier()
    if engine.rank == 0:
        print(json.dumps({"step": (time.perf_counter() - start) / args.steps}))


def measure(args: argparse.Namespace, strategy: str, size: int) -> float:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    command = [mpiexec, "-n", str(size), sys.executable, "-m", "mpi4py", __file__, "--worker", "--strategy", strategy]
    for name in ("hidden", "batch", "steps", "warmup"):
        command += [f"--{name}", str(getattr(args, name))]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        raise SystemExit(f"{strategy} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="allreduce")
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="strategy strings separated by commas, cut only where a new name starts",
    )
    parser.add_argument("-n", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from fast_core.grammar import split_specs
    from fast_core.perfmodel import dense, predict
    from fast_core.perfmodel.calibrate import calibrate

    machine = calibrate(ranks_per_machine=args.n)  # the ranks of these runs share this machine
    layers = [dense(64, args.hidden), dense(args.hidden, 10)]
    print(f"machine: {machine}")
    print(f"model 64-{args.hidden}-10, batch {args.batch} per rank, {args.n} ranks, {args.steps} steps, "
          f"medians of {args.repeats} interleaved rounds\n")
    print("| strategy | predicted ms/step (compute + communication) | measured ms/step (median, range) | "
          "predicted / measured |")
    print("|---|---|---|---|")
    strategies = split_specs(args.strategies)
    measured: dict[str, list[float]] = {s: [] for s in strategies}
    for _ in range(args.repeats):
        for strategy in strategies:
            measured[strategy].append(measure(args, strategy, args.n))
    for strategy in strategies:
        guess = predict(strategy, layers, args.batch, args.n, machine)
        median = statistics.median(measured[strategy])
        print(f"| `{strategy}` | {guess.step * 1e3:.3f} ({guess.compute * 1e3:.3f} + {guess.communication * 1e3:.3f}) "
              f"| {median * 1e3:.3f} ({min(measured[strategy]) * 1e3:.3f}-{max(measured[strategy]) * 1e3:.3f}) "
              f"| {guess.step / median:.2f} |", flush=True)


if __name__ == "__main__":
    main()
