"""fast_core must never import a deep-learning framework: checked in a fresh interpreter, in every tox env."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "jaxlib", "flax", "optax")


def test_fast_core_imports_no_framework() -> None:
    code = (
        "import sys, fast_core, fast_core.engine.mpi, fast_core.model.numpy_model, fast_core.data.datasets\n"
        "import fast_core.pipeline\n"
        f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"fast_core pulled in: {done.stdout.strip()}"
