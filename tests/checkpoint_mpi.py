"""Run under mpiexec: ``python -m mpi4py tests/checkpoint_mpi.py save|load CHECKPOINT OUT``. The same save and load as
tests/test_checkpoint.py's in-process ones, over real MPI ranks; each rank writes what it saved or loaded to
``OUT/<mode><rank>.npz`` for the test to compare."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from test_checkpoint import _load_adagrad, _save_adagrad

import fast_core


def main() -> None:
    mode, path, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    engine = fast_core.init(timeout=60)
    if mode == "save":
        params, state, step = _save_adagrad(engine, path)
    else:
        params, state, step, _ = _load_adagrad(engine, path)
    np.savez(out / f"{mode}{engine.rank}.npz", params=params, state=state, step=step)


if __name__ == "__main__":
    main()
