"""Run tests/cases.py under MPI: ``mpiexec -n 4 python -m mpi4py tests/run_cases.py [name-substring ...]``.

Any failing assertion raises on its rank, and ``python -m mpi4py`` turns that into an abort of the whole job,
so a failure can never leave the other ranks hanging. Rank 0 prints one line per case and a closing count.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import CASES  # noqa: E402

from fast_core import mpi_engine  # noqa: E402


def main(patterns: list[str]) -> None:
    engine = mpi_engine(timeout=60)
    chosen = [n for n in CASES if not patterns or any(p in n for p in patterns)]
    for name in chosen:
        start = time.perf_counter()
        CASES[name](engine)
        engine.barrier()
        if engine.rank == 0:
            print(f"{name} ok ({time.perf_counter() - start:.2f} s) on {engine.size} ranks", flush=True)
    if engine.rank == 0:
        print(f"mpi cases: {len(chosen)} passed, 0 failed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
