"""All multi-rank cases: every ``case_*`` function of the ``cases_*.py`` modules beside this file.

Each case takes this rank's engine, runs the same code on every rank and asserts. pytest runs them in-process on
a LocalCluster (tests/test_multirank.py); run_cases.py runs them under mpiexec with the MPI engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from fast_core.engine import Engine


def _collect() -> dict[str, Callable[[Engine], None]]:
    found: dict[str, Callable[[Engine], None]] = {}
    for path in sorted(Path(__file__).resolve().parent.glob("cases_*.py")):
        module = importlib.import_module(path.stem)
        for name, fn in sorted(vars(module).items()):
            if name.startswith("case_") and callable(fn):
                if name in found:
                    raise RuntimeError(f"two case modules define {name}")
                found[name] = fn
    return found


CASES = _collect()
