"""Which example `fast bench --framework NAME` runs: one entry per framework, the only place to add one.

What an example must do to be benched (fast_examples.numpy_digits and .torch_mnist1d do all of it):

- run as ``python -m mpi4py -m <module>`` and, given no ``--strategy``, take FAST_STRATEGY (``Worker(strategy=None)``,
  or ``strategy_from_environment()``), so the same command runs every strategy;
- accept ``--epochs E`` (and ``--data NAME`` for the names listed in ``data``);
- call ``worker.records.step(loss=..., samples=...)`` once per step, ``worker.records.epoch(val_accuracy=...,
  loss=...)`` at each epoch end (after ``worker.group.consensus_distance()``, so the record carries it), and
  ``worker.records.result(test_accuracy=...)`` at the end;
- for ``--compare-ddp`` (``ddp=True``): accept ``--ddp`` and train with the framework's own data-parallel baseline;
- for the time-to-target column, on rank 0: records of kind "consensus" with ``time`` (seconds since the common
  start) and ``val_accuracy`` of the averaged model (without them the table falls back to rank 0's own epoch
  records and marks it);
- for ``--straggler F``'s calibration: take its steps through the FAST worker (its records then carry the compute
  time) and honour ``--epochs 1``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from fast_core.cli.common import CLIError


@dataclass(frozen=True)
class Framework:
    name: str
    module: str  # the example, run with python -m mpi4py -m <module>
    requires: tuple[str, ...]  # modules it imports that an extra installs
    extra: str  # pip install 'fast-training[<extra>]'
    data: tuple[str, ...] = ()  # values of its --data option; empty: it has none
    ddp: bool = False  # it accepts --ddp (torch DistributedDataParallel on gloo)

    def check(self) -> None:
        """A clear message instead of a traceback on every rank when the framework or its example is missing."""
        for name in self.requires:
            if importlib.util.find_spec(name) is None:
                raise CLIError(
                    f"--framework {self.name} needs the '{name}' module: pip install 'fast-training[{self.extra}]'"
                )
        try:
            found = importlib.util.find_spec(self.module)
        except ImportError:
            found = None
        if found is None:
            raise CLIError(f"--framework {self.name}: its example {self.module} is not installed (yet)")


TASKS = ("digits", "mnist1d")

FRAMEWORKS: dict[str, Framework] = {
    "numpy": Framework("numpy", "fast_examples.numpy_digits", ("sklearn",), "examples"),
    "torch": Framework("torch", "fast_examples.torch_mnist1d", ("torch", "sklearn"), "torch,examples", TASKS, True),
    "tf": Framework("tf", "fast_examples.keras_digits", ("keras", "sklearn"), "tf,examples", TASKS),
    "jax": Framework("jax", "fast_examples.jax_digits", ("jax", "sklearn"), "jax,examples", TASKS),
    # the byte-level GPT on the standard library's source: "test accuracy" is the consensus model's next-byte
    # accuracy on held-out files (its records carry the validation loss); pass --size after --
    "lm": Framework("lm", "fast_examples.torch_lm", ("torch",), "torch", ddp=True),
}
