"""save_checkpoint / load_checkpoint: the job's consensus model, its optimizer state and FAST's state in one file
that resumes on any number of ranks (fast_core.runtime.checkpoint does the collective work and the atomic write).

The optimizer's per-parameter tensors (SGD's momentum buffer, Adam's moments and step, ...) are flattened to named
arrays ``optim/<parameter index>/<key>`` and averaged over ranks like the parameters; its hyper-parameters (lr,
momentum, betas, ...) are rank 0's, as JSON. Floating buffers (BatchNorm statistics) are averaged too.
"""

from __future__ import annotations

import os

import torch
from fast_core.runtime import checkpoint
from fast_core.runtime.checkpoint import Checkpoint, CheckpointError

from .optim_state import optimizer_arrays, optimizer_state
from .optimizer import worker_of
from .staging import as_numpy

_BUFFER = "buffer/"


def save_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Collective: write the consensus of ``model`` (wrapped by ``fast_torch.DistributedOptimizer``), the ranks'
    average of ``optimizer``'s state, the step, strategy and budget spent to ``path`` (rank 0 writes; atomic)."""
    worker = worker_of(model)
    state = optimizer_arrays(optimizer)
    state.update({f"{_BUFFER}{name}": as_numpy(b) for name, b in _buffers(model)})
    groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.state_dict()["param_groups"]]
    checkpoint.save(path, worker, state, extra={"param_groups": _jsonable(groups)})


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Checkpoint:
    """Collective, on any number of ranks: every rank takes the saved consensus model, optimizer state, step and
    the budget the job has left; returns the checkpoint (``.step``, ``.header``). Call it after
    ``DistributedOptimizer`` and before training."""
    worker = worker_of(model)
    loaded = checkpoint.load(path, worker)
    buffers = dict(_buffers(model))
    with torch.no_grad():
        for name, value in loaded.state.items():
            if name.startswith(_BUFFER) and name[len(_BUFFER) :] in buffers:
                buffers[name[len(_BUFFER) :]].copy_(torch.from_numpy(value))
    _restore_optimizer(optimizer, loaded, path)
    return loaded


def _restore_optimizer(optimizer: torch.optim.Optimizer, loaded: Checkpoint, path: str | os.PathLike) -> None:
    current = optimizer.state_dict()
    state = optimizer_state(loaded.state)
    saved_groups = loaded.extra.get("param_groups", [])
    if len(saved_groups) != len(current["param_groups"]):
        raise CheckpointError(
            f"checkpoint {os.fspath(path)!r} has {len(saved_groups)} optimizer parameter groups, this optimizer "
            f"{len(current['param_groups'])}; build the optimizer as it was when the checkpoint was saved"
        )
    groups = []
    for group, saved in zip(current["param_groups"], saved_groups, strict=True):
        group = dict(group)
        for key, value in saved.items():
            if key in group:
                group[key] = tuple(value) if isinstance(group[key], tuple) else value
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _buffers(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, b) for n, b in model.named_buffers() if b.dtype.is_floating_point and b.numel()]


def _jsonable(value: object) -> object:
    """Hyper-parameters as JSON: tuples become lists, anything else that JSON cannot hold is left out."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items() if _jsonable(v) is not _SKIP}
    if isinstance(value, list | tuple):
        items = [_jsonable(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return _SKIP


_SKIP = object()
