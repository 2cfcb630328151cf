"""Every strategy through fast_jax on the example's MLP, in one mpiexec launch (JAX imports and compiles once per rank).

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/jax_adapter/jax_cases.py [--epochs E] [strategy ...]

Trains the digits model of examples/jax_digits.py once per strategy, all-reduce first, and checks that the
averaged model's test accuracy is within ``--tolerance`` of all-reduce's. Rank 0 prints one line per strategy and
a final ``N passed, M failed`` line; a failure raises on every rank, so ``python -m mpi4py`` aborts the job.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import fast_jax as fast
from fast_examples import jax_digits

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
# Trained end to end through the adapter under MPI and printed, but not compared with all-reduce, because they do
# not reliably come within 2 points of it (measured numbers in test_jax_mpi.py):
# - fast:torus, FAST as published (README, 'A note on FAST'): every neighbour gradient is one more unscaled
#   optimizer step, so its effective learning rate is (1 + degree) times the others' and replicas drift apart
#   between its per-epoch restarts; asynchronous, so it varies from run to run (synchronous=true diverges: 0.31).
# - async:torus,remix_stale=true, the literal reading of asynchronous averaging: a neighbour's old message is mixed
#   again at every step until a new one arrives, pulling the model back to stale parameters.
UNCOMPARED = ["fast:torus", "async:torus,remix_stale=true"]


def run(strategy: str, epochs: int) -> tuple[float, float]:
    start = time.perf_counter()
    accuracy = jax_digits.train(strategy, "digits", epochs=epochs, verbose=False)
    return accuracy, time.perf_counter() - start


def verdict(strategy: str, accuracy: float, reference: float, tolerance: float) -> str | None:
    """None when the strategy passes or is not compared, else why it failed."""
    if strategy in UNCOMPARED or accuracy >= reference - tolerance:
        return None
    return f"more than {tolerance:.2f} below all-reduce"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("strategies", nargs="*", default=COMPARED + UNCOMPARED, help="all-reduce always runs first")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest accuracy drop below all-reduce's")
    args = parser.parse_args()
    engine = fast.init()
    say = print if engine.rank == 0 else (lambda *a, **k: None)

    reference, seconds = run("allreduce", args.epochs)
    say(f"allreduce: test accuracy {reference:.4f} (reference, {seconds:.1f} s)", flush=True)
    failures: list[str] = []
    for strategy in [s for s in args.strategies if s != "allreduce"]:
        accuracy, seconds = run(strategy, args.epochs)
        problem = verdict(strategy, accuracy, reference, args.tolerance)
        note = "not compared (see UNCOMPARED)" if strategy in UNCOMPARED else (problem and f"FAILED: {problem}") or "ok"
        say(f"{strategy}: test accuracy {accuracy:.4f} ({seconds:.1f} s) {note}", flush=True)
        if problem:
            failures.append(strategy)
    compared = [s for s in args.strategies if s != "allreduce" and s not in UNCOMPARED]
    # rank 0 decides for all, so every rank raises (or none does) even if accuracies differed in the last bit
    failed = np.array([len(failures)], dtype=np.int64)
    engine.broadcast(failed, 0)
    say(f"{len(compared) - int(failed[0])} passed, {int(failed[0])} failed", flush=True)
    if failed[0]:
        raise AssertionError(f"more than {args.tolerance} below all-reduce's accuracy {reference:.4f}: {failures}")


if __name__ == "__main__":
    main()
