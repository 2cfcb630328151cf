"""save_checkpoint / resume for ``model.fit`` with fast_tf.Callback: the job's consensus model, the ranks' average
of the optimizer's variables and of the floating non-trainable ones (BatchNorm statistics), and FAST's state in one
file that resumes on any number of ranks (fast_core.runtime.checkpoint does the collective work and the atomic write).

Keras' own ``ModelCheckpoint`` writes each rank's replica, which under a decentralized strategy is not the model
the job trained. Here the optimizer's variables (``iterations``, the learning rate, momenta, Adam's moments) are
saved in ``optimizer.variables`` order as ``opt/<i>``, with the optimizer's class and the variables' shapes in the
header so that a file of another optimizer is refused (not their names: Keras numbers them per process). Integer
ones (``iterations``) are averaged and rounded down like every fast_core average.
"""

from __future__ import annotations

import os

import keras

from fast_core import Worker
from fast_core.runtime import checkpoint
from fast_core.runtime.checkpoint import Checkpoint, CheckpointError

from .model import KerasModel
from .variables import dtype_of, floating

_OPT = "opt/"
_BUFFER = "buffer/"


def save_checkpoint(path: str | os.PathLike, callback: keras.callbacks.Callback) -> None:
    """Collective: write the consensus of the model ``callback`` trains, the ranks' average of its optimizer's
    variables and BatchNorm statistics, the step, strategy and budget spent to ``path`` (rank 0 writes, atomically).

    Call it on every rank after ``model.fit``, or from a callback placed after ``callback`` at an epoch end under a
    synchronous strategy (under an asynchronous one the ranks reach their epoch ends at other times)."""
    worker, model, adapter = _fit_of(callback, "save_checkpoint")
    adapter.sync()
    adapter.new_step()  # the parameters are read afresh: the last step may have changed them
    optimizer = optimizer_of(model)
    state = {f"{_OPT}{i}": v.numpy() for i, v in enumerate(optimizer.variables)}
    state.update({f"{_BUFFER}{i}": v.numpy() for i, v in enumerate(floating(model.non_trainable_variables))})
    checkpoint.save(path, worker, state, extra={"optimizer": _describe(optimizer)})


def load_into(path: str | os.PathLike, callback: keras.callbacks.Callback) -> Checkpoint:
    """Collective, on any number of ranks: the saved consensus model, optimizer variables, BatchNorm statistics,
    step and the budget the job has left, set into the callback's model. ``fast_tf.Callback(resume_from=path)``
    calls it at the start of its first fit; the model must be built and compiled with the same optimizer class."""
    worker, model, _ = _fit_of(callback, "resume_from")
    loaded = checkpoint.load(path, worker)  # the parameters, step and budget
    optimizer = optimizer_of(model)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    saved, current = loaded.extra.get("optimizer", {}), _describe(optimizer)
    if saved != current:
        raise CheckpointError(
            f"checkpoint {os.fspath(path)!r} holds the state of {_told(saved)}, this model's optimizer is "
            f"{_told(current)}; compile the model with the optimizer the checkpoint was saved with"
        )
    _assign(path, optimizer.variables, loaded, _OPT)
    _assign(path, floating(model.non_trainable_variables), loaded, _BUFFER)
    return loaded


def optimizer_of(model: keras.Model) -> keras.optimizers.Optimizer:
    """The optimizer that owns the state: the user's, also when wrapped by fast_tf.DistributedOptimizer."""
    optimizer = model.optimizer
    if optimizer is None:
        raise CheckpointError("the model has no optimizer: compile it before saving or resuming a checkpoint")
    return getattr(optimizer, "optimizer", optimizer)


def _fit_of(callback: keras.callbacks.Callback, call: str) -> tuple[Worker, keras.Model, KerasModel]:
    """The worker, model and adapter of a fast_tf.Callback's fit (read by name: that module imports this one)."""
    worker, model = getattr(callback, "worker", None), getattr(callback, "_fit_model", None)
    adapter = getattr(callback, "adapter", None)
    if worker is None or model is None or adapter is None:
        raise CheckpointError(
            f"{call} needs the fast_tf.Callback of a fit that has begun: pass the callback given to model.fit, "
            "after fit (or from a callback at an epoch end)"
        )
    return worker, model, adapter


def _assign(path: str | os.PathLike, variables: list, loaded: Checkpoint, prefix: str) -> None:
    for i, variable in enumerate(variables):
        saved = loaded.state.get(f"{prefix}{i}")
        if saved is None or tuple(saved.shape) != tuple(variable.shape):
            found = "missing" if saved is None else f"of shape {tuple(saved.shape)}"
            raise CheckpointError(
                f"checkpoint {os.fspath(path)!r}: variable {_name(variable)!r} is {found} there, this model's has "
                f"shape {tuple(variable.shape)}; resume with the model and optimizer the checkpoint was saved with"
            )
        variable.assign(saved.astype(dtype_of(variable)))


def _describe(optimizer: keras.optimizers.Optimizer) -> dict:
    return {"class": type(optimizer).__name__, "shapes": [list(v.shape) for v in optimizer.variables]}


def _told(description: dict) -> str:
    return f"{description.get('class', 'an unknown optimizer')} with {len(description.get('shapes', []))} variables"


def _name(variable: keras.Variable) -> str:
    return str(getattr(variable, "path", variable.name))
