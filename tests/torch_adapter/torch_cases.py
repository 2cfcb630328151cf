"""Every strategy through fast_torch on the example's CNN, in one mpiexec launch (torch imports once per rank).

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/torch_adapter/torch_cases.py [--epochs E] [strategy ...]

Trains the digits model of examples/torch_mnist1d.py once per strategy (15 epochs, lr 0.05, SGD momentum 0.9) and
compares it with all-reduce (tests/strategy_comparison.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import fast_torch as fast
from fast_examples import torch_mnist1d

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared comparison
from strategy_comparison import run_comparison  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    run_comparison(
        lambda strategy, epochs: torch_mnist1d.train(strategy, "digits", epochs, verbose=False), fast.init(), 15
    )
