"""Every strategy through fast_jax on the example's MLP, in one mpiexec launch (JAX imports and compiles once per rank).

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/jax_adapter/jax_cases.py [--epochs E] [strategy ...]

Trains the digits model of examples/jax_digits.py once per strategy (15 epochs) and compares it with all-reduce
(tests/strategy_comparison.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import fast_jax as fast
from fast_examples import jax_digits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared comparison
from strategy_comparison import run_comparison  # noqa: E402

if __name__ == "__main__":
    run_comparison(
        lambda strategy, epochs: jax_digits.train(strategy, "digits", epochs, verbose=False), fast.init(), 15
    )
