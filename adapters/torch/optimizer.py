"""DistributedOptimizer: any torch.optim optimizer, hooked so a fast_core strategy runs around its step.

The user's optimizer object is returned, not a subclass or a wrapper: FAST attaches through PyTorch's supported
extension points (step pre/post hooks, state-dict hooks), so lr schedulers, state_dict()/load_state_dict() and
zero_grad() work as before.
"""

from __future__ import annotations

import os
import weakref

import torch
from fast_core import Budget, Engine, Strategy, Worker
from fast_core.runtime.process import init as default_engine

from .model import TorchModel
from .tensors import broadcast_tensors, floating_tensors

_WORKERS: weakref.WeakKeyDictionary[torch.nn.Module, Worker] = weakref.WeakKeyDictionary()
_STATE_KEY = "fast"


def DistributedOptimizer(  # noqa: N802 - the name Horovod users know
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    strategy: Strategy | str | None = None,
    *,
    engine: Engine | None = None,
    log_every: int | None = None,
    budget: Budget | None = None,
    precision: str | torch.dtype | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
) -> torch.optim.Optimizer:
    """Hook ``optimizer`` so ``strategy`` runs at every ``optimizer.step()``; returns ``optimizer`` itself.

    With no ``strategy``, the one ``fast run --strategy`` passes (``FAST_STRATEGY``), else all-reduce. ``budget``:
    a shared work budget (``fast_core.Budget``; ``opt.fast_worker.claim_batch(n)`` before each batch), None for
    ``fast run --budget-samples/--budget-seconds``'s, else none. ``tensorboard``: a folder where this rank writes
    its records (``opt.fast_worker.records``) as TensorBoard scalars while it trains, None for ``fast run
    --tensorboard``'s (the ``tensorboard`` extra; docs/guides/tensorboard.md).

    The model's parameters become views of one flat buffer, all ranks start from rank 0's parameters (and
    buffers), and the optimizer must hold exactly the model's trainable parameters. A model on a GPU (any torch
    device), in float16/bfloat16 or of several dtypes is mixed through host copies in ``precision`` ("float32",
    the default there, or "float64") and written back in each parameter's own dtype, on its own device.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if model in _WORKERS:
        raise RuntimeError("this model is already wrapped by a DistributedOptimizer")
    adapter = TorchModel(model, optimizer, precision)
    _check_same_parameters(optimizer, adapter)
    worker = Worker(
        adapter, strategy, engine or default_engine(), log_every=log_every, budget=budget, tensorboard=tensorboard
    )
    worker.start()
    broadcast_tensors(floating_tensors(model, parameters=False), worker.engine)  # e.g. BatchNorm statistics
    _WORKERS[model] = worker

    gradients_ready = [False]  # synchronize() ran this step's gradient hook already

    def synchronize() -> None:
        """Run this step's gradient hook now (all-reduce averages the gradients), e.g. to clip the averaged
        gradients before ``step()``; ``step()`` then does not run it again. A no-op when already run."""
        if not adapter.applying and not gradients_ready[0]:
            adapter.new_step()  # backward wrote new gradients on the device
            try:
                worker.before_step()
            finally:
                adapter.new_step()  # the user may change the model before the step hook
            gradients_ready[0] = True

    def before(opt, args, kwargs):
        synchronize()

    def after(opt, args, kwargs):
        if not adapter.applying:
            gradients_ready[0] = False
            adapter.new_step()  # the optimizer's step changed the parameters (a read outside a hook is stale)
            try:
                worker.after_step()
            finally:
                adapter.new_step()  # host copies are not trusted outside a hook: the user may edit the model

    def save(opt, state):
        state[_STATE_KEY] = {"step": worker.step, "strategy": repr(worker.strategy)}
        return state

    def load(opt, state):
        saved = state.pop(_STATE_KEY, None)
        if saved is not None:
            worker.step = int(saved["step"])  # the step clock: the strategy's step and the metrics' count
        return state

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)
    optimizer.register_state_dict_post_hook(save)
    optimizer.register_load_state_dict_pre_hook(load)
    optimizer.fast_worker = worker  # the Worker behind this optimizer: metrics, consensus distance, close()
    optimizer.fast_synchronize = synchronize
    return optimizer


def worker_of(model: torch.nn.Module) -> Worker:
    """The Worker training ``model`` (created by DistributedOptimizer)."""
    try:
        return _WORKERS[model]
    except KeyError:
        raise RuntimeError(
            "this model is not wrapped: call fast_torch.DistributedOptimizer(opt, model) first"
        ) from None


def _check_same_parameters(optimizer: torch.optim.Optimizer, adapter: TorchModel) -> None:
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
    in_model = {id(p) for p in adapter.params_list}
    if in_optimizer != in_model:
        raise ValueError(
            f"the optimizer holds {len(in_optimizer)} trainable parameters and the model {len(in_model)}, not the "
            "same ones; build the optimizer from model.parameters() of the model you pass"
        )
