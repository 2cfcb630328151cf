"""Every strategy through fast_torch on the example's CNN, in one mpiexec launch (torch imports once per rank).

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/torch_adapter/torch_cases.py [--epochs E] [strategy ...]

Trains the digits model of examples/torch_mnist1d.py once per strategy, all-reduce first, and checks that the
averaged model's test accuracy is within ``--tolerance`` of all-reduce's. Rank 0 prints one line per strategy and
a final ``N passed, M failed`` line; a failure raises on every rank, so ``python -m mpi4py`` aborts the job
(exit code != 0).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import fast_torch as fast
from fast_examples import torch_mnist1d

COMPARED = [
    "localsgd:period=4",
    "dpsgd:ring",
    "dpsgd:exp1",
    "sgp",
    "async:torus",
    "async:torus,staleness=1",
    "adpsgd:ring",
    "easgd:tau=4",
    "easgd:tau=4,synchronous=false",
    "gossip",
    "gossip:push,synchronous=false",
]
# Run (each must train end to end through the adapter under MPI) but NOT compared with all-reduce, because they do
# not reliably come within 2 points of it. Measured at 15 epochs, lr 0.05, SGD momentum 0.9, 4 ranks on 2 cores,
# where all-reduce reaches 0.9889 (deterministic):
# - fast:torus, FAST as published (README, 'A note on FAST'), even with its best-replica restart every epoch:
#   0.58, 0.63, 0.72, 0.77, 0.78, 0.86, 0.90 (asynchronous, so it varies); reset_optimizer=true 0.84, 0.91;
#   synchronous=true 0.08 (diverges). Each neighbour gradient is one more unscaled optimizer step, so its
#   effective learning rate is (1 + degree) times the others'; at lr 0.0167 and 0.01 it reached 0.95-0.99.
# - async:torus,remix_stale=true, the literal reading of asynchronous averaging: it mixes the newest message of
#   each neighbour at every step even when that message was already mixed, so a stalled neighbour's old parameters
#   keep pulling: 0.9583-0.9861 over 31 runs (mean staleness 2.6 steps, max 18: 4 ranks share 2 cores). The
#   default mixes each message once (compared above): 0.9889-0.9972 over 11 runs; with staleness=1 0.9750-0.9861.
UNCOMPARED = ["async:torus,remix_stale=true", "fast:torus"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("strategies", nargs="*", default=COMPARED + UNCOMPARED, help="all-reduce always runs first")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest accuracy drop below all-reduce's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = fast.init()

    def run(strategy: str) -> tuple[float, float]:
        start = time.perf_counter()
        result = torch_mnist1d.train(strategy, "digits", epochs=args.epochs, verbose=False)
        return result, time.perf_counter() - start

    reference, seconds = run("allreduce")
    if engine.rank == 0:
        print(f"allreduce: test accuracy {reference:.4f} (reference, {seconds:.1f} s)", flush=True)
    failed: list[str] = []
    compared = 0
    for strategy in [s for s in args.strategies if s != "allreduce"]:
        result, seconds = run(strategy)
        if strategy in UNCOMPARED:
            verdict = "run, not compared (see UNCOMPARED in tests/torch_adapter/torch_cases.py)"
        else:
            compared += 1
            ok = result >= reference - args.tolerance
            verdict = "ok" if ok else f"FAILED: more than {args.tolerance:.2f} below all-reduce"
            if not ok:
                failed.append(strategy)
        if engine.rank == 0:
            print(f"{strategy}: test accuracy {result:.4f} ({seconds:.1f} s) {verdict}", flush=True)
    # rank 0's verdict for all, so every rank raises (or none does) even if accuracies differed in the last bit
    verdict = np.array([len(failed)], dtype=np.int64)
    engine.broadcast(verdict, 0)
    if engine.rank == 0:
        print(f"{compared - len(failed)} passed, {len(failed)} failed", flush=True)
    if verdict[0]:
        raise AssertionError(f"more than {args.tolerance} below all-reduce's accuracy {reference:.4f}: {failed}")


if __name__ == "__main__":
    main()
