"""Horovod's elastic training for PyTorch (``hvd.elastic``) on FAST: ``run``, ``ObjectState`` and ``TorchState``.

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

The run loop and the commit, restore and sync of state are fast_core's (``fast_core.interop.elastic``); here a
module and an optimizer only become named NumPy arrays and back. Run under ``fast run --fault-tolerant
[--max-restarts K]`` for the job to survive a lost rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import torch
from fast_core import Engine
from fast_core.interop.elastic import HorovodInternalError, HostsUpdatedInterrupt, ObjectState, Part, State, run, track

from ..optim_state import load_optimizer, optimizer_arrays, optimizer_options
from ..staging import as_numpy

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]

_GROUPS = "param_groups"
_STEP = "fast_step"


class TorchState(ObjectState):
    """Horovod's ``TorchState``: ``model`` (its state_dict: parameters and buffers), ``optimizer`` (its state and
    hyper-parameters; with a FAST DistributedOptimizer also its step count) and any other values as keyword
    arguments, each an attribute (``state.model``, ``state.epoch``). Any attribute holding a ``torch.nn.Module`` or
    ``torch.optim.Optimizer`` is saved as arrays; the rest as in ``ObjectState``. ``fast_engine``: the engine of
    this rank (None: this process's)."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        fast_engine: Engine | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(fast_engine=fast_engine, model=model, optimizer=optimizer, **kwargs)
        for value in (model, optimizer, *kwargs.values()):
            worker = getattr(value, "fast_worker", None)  # hvd.DistributedOptimizer's: the run recovers through it
            if worker is not None:
                track(worker)

    def part(self, value: Any) -> Part | None:
        if isinstance(value, torch.nn.Module):
            return _Module(value)
        if isinstance(value, torch.optim.Optimizer):
            return _Optimizer(value)
        return None


class _Module:
    """A module's state_dict as arrays, written back into its own tensors (parameters stay where they are)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def read(self) -> dict[str, Any]:
        return {name: as_numpy(tensor) for name, tensor in self.module.state_dict().items()}

    def write(self, values: dict[str, Any]) -> None:
        tensors = self.module.state_dict()
        if set(tensors) != set(values):
            raise ValueError(
                f"the model's state_dict has {sorted(set(tensors) ^ set(values))[:5]} where the state's has not: "
                "build the same model on every rank"
            )
        with torch.no_grad():
            for name, tensor in tensors.items():
                tensor.copy_(torch.from_numpy(np.asarray(values[name])))


class _Optimizer:
    """An optimizer's per-parameter state as arrays, its hyper-parameters as JSON, and a FAST optimizer's step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def read(self) -> dict[str, Any]:
        values: dict[str, Any] = dict(optimizer_arrays(self.optimizer))
        values[_GROUPS] = optimizer_options(self.optimizer)
        worker = getattr(self.optimizer, "fast_worker", None)
        if worker is not None:
            values[_STEP] = worker.step
        return values

    def write(self, values: dict[str, Any]) -> None:
        load_optimizer(self.optimizer, values, values[_GROUPS])
        worker = getattr(self.optimizer, "fast_worker", None)
        if worker is not None and _STEP in values:
            worker.step = int(values[_STEP])  # the step clock of the commit (lockstep schedules count from it)


def __getattr__(name: str) -> Any:
    if name == "ElasticSampler":
        raise AttributeError(
            "fast_torch.horovod.elastic has no ElasticSampler: shard the data by hvd.rank() and hvd.size() (e.g. a "
            "DistributedSampler made again in a reset callback) and keep the batch number in the state"
        )
    raise AttributeError(f"module 'fast_torch.horovod.elastic' has no attribute {name!r}")
