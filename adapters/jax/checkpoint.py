"""save_checkpoint / load_checkpoint for a ``fast_jax.distributed`` step: the job's consensus params, the ranks'
average of the optax state and FAST's state in one file that resumes on any number of ranks
(fast_core.runtime.checkpoint does the collective work and the atomic write; nothing is pickled).

The optax state's leaves are saved as named arrays ``opt/<key path>`` and averaged over ranks like the params
(integer leaves such as Adam's step count are averaged and rounded down, as ``fast_core.engine.collectives`` casts).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import jax
from fast_core.runtime import checkpoint
from fast_core.runtime.checkpoint import Checkpoint, CheckpointError

from .flat import host_leaves
from .step import DistributedStep

_OPT = "opt/"


def save_checkpoint(path: str | os.PathLike, step: DistributedStep, params: Any, opt_state: Any) -> None:
    """Collective: write the consensus of ``params``, the ranks' average of ``opt_state``, the step, strategy and
    budget spent to ``path`` (rank 0 writes, atomically). ``params``/``opt_state``: the step's latest outputs."""
    params, opt_state = step.start(params, opt_state)  # a no-op once the step has run
    step.model.load(params, opt_state)
    names, arrays, _ = host_leaves(opt_state, step.engine)
    checkpoint.save(path, step.worker, {f"{_OPT}{name}": a for name, a in zip(names, arrays, strict=True)})


def load_checkpoint(
    path: str | os.PathLike, step: DistributedStep, params: Any, opt_state: Any
) -> tuple[Any, Any, Checkpoint]:
    """Collective, on any number of ranks: ``(params, opt_state, checkpoint)`` with the saved consensus params and
    averaged optax state, the step and the budget the job has left. ``params``/``opt_state``: freshly initialised
    ones of the same model and optimizer (their structure and shapes must match the file's). Call before training."""
    params, opt_state = step.start(params, opt_state)
    loaded = checkpoint.load(path, step.worker)  # the worker's model now holds the saved params
    names, arrays, treedef = host_leaves(opt_state, step.engine)
    restored = []
    for name, template in zip(names, arrays, strict=True):
        saved = loaded.state.get(f"{_OPT}{name}")
        if saved is None or saved.shape != template.shape:
            found = "missing" if saved is None else f"of shape {saved.shape}"
            raise CheckpointError(
                f"checkpoint {os.fspath(path)!r}: optimizer state leaf '{name}' is {found}, this optimizer's has "
                f"shape {template.shape}; load with the optimizer the checkpoint was saved with"
            )
        restored.append(np.asarray(saved, dtype=template.dtype))
    opt_state = jax.tree_util.tree_unflatten(treedef, jax.device_put(restored))
    step.model.load(step.model.params_tree(), opt_state)
    return step.model.params_tree(), opt_state, loaded
