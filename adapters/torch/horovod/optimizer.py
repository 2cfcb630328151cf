"""Horovod's ``DistributedOptimizer``, ``broadcast_parameters`` and ``broadcast_optimizer_state`` on fast_torch.

Horovod wraps an optimizer given only its parameters; fast_torch's ``DistributedOptimizer`` wants the module. Here
the parameters Horovod names (``named_parameters``, else the optimizer's own) form the module FAST sees, so the
strategy (all-reduce unless ``fast run --strategy`` says otherwise) mixes exactly what the optimizer updates. The
optimizer object itself is returned, with Horovod's ``synchronize()`` and ``skip_synchronize()`` added.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import torch
from fast_core import Budget, Strategy
from fast_core.engine.collectives import broadcast_arrays, check_same_arrays
from fast_core.interop.horovod import (
    Average,
    ReduceOp,
    Sum,
    check_optimizer_options,
    check_process_set,
    compressed_strategy,
    global_process_set,
    resolve_op,
)
from fast_core.runtime.process import init as default_engine

from ..optim_state import load_optimizer, optimizer_arrays, optimizer_options
from ..optimizer import DistributedOptimizer as _fast_optimizer
from ..staging import as_numpy
from .lifecycle import shutdown_at_exit


class _Parameters(torch.nn.Module):
    """The parameters a Horovod optimizer updates, seen as a module (their names need not be attribute names)."""

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        super().__init__()
        self._named = named

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.nn.Parameter]]:
        yield from self._named


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    op: ReduceOp = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
    *,
    strategy: Strategy | str | None = None,
    budget: Budget | None = None,
) -> torch.optim.Optimizer:
    """``optimizer`` itself, hooked so FAST's strategy runs at each ``step()`` (all-reduce of the gradients by
    default: Horovod's own rule; ``fast run --strategy`` or ``strategy=`` picks another).

    Gradients of several backward passes accumulate in ``.grad`` and are reduced once at ``step()``, which is what
    ``backward_passes_per_step`` asks for; ``num_groups``/``groups`` need nothing (FAST sends all gradients in one
    message); ``op=hvd.Sum`` gives the sum of the ranks' gradients (all-reduce only). Refused with a reason:
    Adasum, process sets, ``op=hvd.Sum`` under a strategy that mixes parameters.
    """
    op = resolve_op(op)
    check_optimizer_options(op, gradient_predivide_factor, backward_passes_per_step)
    check_process_set(process_set)
    strategy = compressed_strategy(compression, strategy, default_engine())
    named = _named(optimizer, named_parameters)
    optimizer = _fast_optimizer(optimizer, _Parameters(named), strategy, budget=budget)
    worker = optimizer.fast_worker
    if op is Sum and worker.strategy.name != "allreduce":
        raise ValueError(
            f"op=hvd.Sum sums the ranks' gradients, which only all-reduce does; under {worker.strategy.name} use "
            "op=hvd.Average (the default)"
        )
    scale = float(worker.engine.size) if op is Sum else 1.0
    _add_synchronize(optimizer, [p for _, p in named], scale)
    shutdown_at_exit(worker)
    return optimizer


def _named(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None
) -> list[tuple[str, torch.nn.Parameter]]:
    """The trainable parameters of ``optimizer``, each named once (Horovod's checks: names unique, all named)."""
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if named_parameters is None:
        return [(f"noname.{i}", p) for i, p in enumerate(in_optimizer)]
    named = [(str(name), p) for name, p in named_parameters]
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"named_parameters holds these names more than once: {duplicates[:5]}")
    by_id = {id(p): (name, p) for name, p in named}
    unnamed = [i for i, p in enumerate(in_optimizer) if id(p) not in by_id]
    if unnamed:
        raise ValueError(
            f"named_parameters was given, but {len(unnamed)} of the optimizer's parameters are not in it; pass "
            "model.named_parameters() of the model the optimizer was built from"
        )
    return [by_id[id(p)] for p in in_optimizer]


def _add_synchronize(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], scale: float) -> None:
    """Horovod's ``synchronize()`` (reduce the gradients now, e.g. to clip them before ``step()``) and
    ``skip_synchronize()``: fast_torch's step does not reduce again after ``synchronize()``, so the context only
    documents the intent."""
    scaled = [False]

    def synchronize() -> None:
        optimizer.fast_synchronize()
        if scale != 1.0 and not scaled[0]:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(scale)
            scaled[0] = True

    @contextmanager
    def skip_synchronize() -> Iterator[None]:
        yield

    def before(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        synchronize()

    def after(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        scaled[0] = False

    optimizer.register_step_pre_hook(before)  # after fast_torch's own: it runs first
    optimizer.register_step_post_hook(after)
    optimizer.synchronize = synchronize
    optimizer.skip_synchronize = skip_synchronize


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite, in place, every rank's tensors with rank ``root_rank``'s: ``model.state_dict()`` (integer
    buffers too), ``model.named_parameters()``, or a list of tensors or (name, tensor) pairs. Bit-exact, one
    message for all."""
    if isinstance(params, dict):
        tensors = [tensor for _, tensor in sorted(params.items())]
    else:
        tensors = [item[1] if isinstance(item, tuple) else item for item in params]
    bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
    if bad:
        raise TypeError(f"broadcast_parameters() takes tensors (a state_dict or named_parameters()), got a {bad[0]}")
    tensors = [t for t in tensors if t.numel()]
    engine = default_engine()
    arrays = [_host(t) for t in tensors]
    check_same_arrays(arrays, engine, "broadcast_parameters()")
    with torch.no_grad():
        for tensor, value in zip(tensors, broadcast_arrays(arrays, engine, root_rank), strict=True):
            tensor.copy_(torch.from_numpy(value))


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Give every rank rank ``root_rank``'s optimizer state (momentum buffers, Adam's moments and step) and
    hyper-parameters (learning rate, betas, ...), e.g. after rank 0 loaded a checkpoint.

    The layout travels as JSON and the values as raw numbers (never a pickle); a rank whose optimizer has no state
    yet (a new optimizer: no step taken) receives it all the same, so no dummy step is needed as in Horovod.
    """
    engine = default_engine()
    if not 0 <= root_rank < engine.size:
        raise ValueError(f"root_rank {root_rank} is not a rank: give 0 to {engine.size - 1}")
    mine = optimizer_arrays(optimizer)
    groups = optimizer_options(optimizer)
    layout = {name: [list(a.shape), a.dtype.str] for name, a in mine.items()}
    text = json.dumps({"layout": layout, "groups": groups}) if engine.rank == root_rank else ""
    root = json.loads(engine.broadcast_text(text, root_rank))
    if len(root["groups"]) != len(groups):
        raise ValueError(
            f"rank {engine.rank}'s optimizer has {len(groups)} parameter groups and rank {root_rank}'s "
            f"{len(root['groups'])}: build the same optimizer on every rank"
        )
    shapes = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in root["layout"].items()}
    arrays = [_own_or_zeros(mine.get(name), shape, dtype) for name, (shape, dtype) in shapes.items()]
    check_same_arrays(arrays, engine, "broadcast_optimizer_state()")
    values = broadcast_arrays(arrays, engine, root_rank)
    load_optimizer(optimizer, dict(zip(shapes, values, strict=True)), root["groups"])


def _own_or_zeros(own: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if own is not None and own.shape == shape and own.dtype == dtype:
        return np.ascontiguousarray(own) if own.ndim else own
    return np.zeros(shape, dtype=dtype)


def _host(tensor: torch.Tensor) -> np.ndarray:
    return np.asarray(as_numpy(tensor), order="C")
