"""A torch.nn.Module seen through fast_core's adapter contract: zero-copy on the CPU, staged on a device.

At wrap time every trainable parameter is moved into one contiguous tensor (one per device and dtype) and replaced
by a view of it, and likewise its gradient. On the CPU in float32/float64 the NumPy buffers fast_core mixes are the
model's own storage: no copy per step; elsewhere they are host copies staged by ``fast_torch.staging``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import torch
from fast_core.model.flat import FlatLayout

from .optim_state import optimizer_arrays, optimizer_state
from .staging import FLOATS, Groups, mixing_dtype


def trainable_parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """Named parameters that require grad, each once (tied weights appear under their first name)."""
    seen: set[int] = set()
    for name, param in module.named_parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            yield name, param


def _check(named: list[tuple[str, torch.nn.Parameter]]) -> None:
    if not named:
        raise ValueError("the model has no parameter that requires grad: there is nothing to train or average")
    for name, param in named:
        if param.dtype not in FLOATS:
            raise TypeError(
                f"parameter '{name}' is {param.dtype}; fast_torch mixes float16, bfloat16, float32 and float64 "
                "parameters (freeze the others: requires_grad_(False))"
            )
        if param.device.type == "meta":
            raise ValueError(f"parameter '{name}' is on the meta device: materialise the model (to_empty) first")


class TorchModel:
    """Flat views of a module's trainable parameters and gradients, plus its optimizer.

    On the CPU in float32 or float64 the NumPy buffers fast_core mixes are the model's own storage (zero copy).
    On a GPU (any torch device), in float16/bfloat16, or with several dtypes, the parameters are views of one flat
    tensor per device and dtype, and fast_core mixes host copies in ``precision`` (float32 unless all parameters
    are float64), staged only when a strategy reads or writes them (``fast_torch.staging``).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        precision: str | torch.dtype | None = None,
    ) -> None:
        named = list(trainable_parameters(module))
        _check(named)
        self.module = module
        self.optimizer = optimizer
        self.applying = False  # True while apply_gradient runs the optimizer for a neighbour's gradient
        params = [p for _, p in named]
        groups = Groups(params, mixing_dtype(params, precision))
        self.groups = groups
        self.params_list = [params[i] for i in groups.order]
        self._param_views = [groups.param_views[i] for i in groups.order]
        self._grad_views = [groups.grad_views[i] for i in groups.order]
        mixing = str(groups.mixing).removeprefix("torch.")
        self.layout = FlatLayout([(named[i][0], tuple(params[i].shape), mixing) for i in groups.order])
        self.staged = not groups.zero_copy
        self._host_params, self._host_grads = groups.host_buffers()
        self._params_np = self._host_params.numpy()
        self._grads_np = self._host_grads.numpy()
        self._params_current = False  # staged only: the host copy holds the device's values
        self._grads_current = False

    def new_step(self) -> None:
        """The model may have changed since the host copies were staged (a step, an edit by the user): the next
        read stages again. DistributedOptimizer calls it around every hook; a no-op for zero-copy models."""
        self._params_current = self._grads_current = False

    # adapter contract -------------------------------------------------------------------------------------------
    def params(self) -> np.ndarray:
        self._check_storage()
        if self.staged and not self._params_current:
            self.groups.to_host(self.groups.flats, self._host_params)
            self._params_current = True
        return self._params_np

    def set_params(self, flat: np.ndarray) -> None:
        if flat is not self._params_np:
            np.copyto(self._params_np, flat)
        if self.staged:
            self.groups.to_device(self._host_params, self.groups.flats)
            self._params_current = True

    def grads(self) -> np.ndarray:
        """The gradients as one flat buffer (staged from the device once per hook when not zero-copy)."""
        self._check_storage()
        if self.staged and self._grads_current:
            return self._grads_np
        self._restore_grad_views()
        if self.staged:
            self.groups.to_host(self.groups.grad_flats, self._host_grads)
            self._grads_current = True
        return self._grads_np

    def set_grads(self, flat: np.ndarray) -> None:
        self._restore_grad_views()
        if flat is not self._grads_np:
            np.copyto(self._grads_np, flat)
        if self.staged:
            self.groups.to_device(self._host_grads, self.groups.grad_flats)
            self._grads_current = True

    def _restore_grad_views(self) -> None:
        """Gradients torch re-allocated (zero_grad(set_to_none=True)) are copied back into their views and the
        views restored as ``param.grad``, so the next step writes into the flat buffer again."""
        with torch.no_grad():
            for param, view in zip(self.params_list, self._grad_views, strict=True):
                grad = param.grad
                if grad is None:
                    view.zero_()
                elif grad.data_ptr() != view.data_ptr():
                    view.copy_(grad)
                if grad is None or grad.data_ptr() != view.data_ptr():
                    param.grad = view

    def apply_gradient(self, flat_grad: np.ndarray) -> None:
        """One step of the user's optimizer with this gradient; FAST's hooks see ``applying`` and stay out."""
        if self.optimizer is None:
            raise RuntimeError("apply_gradient needs the optimizer: wrap the model in fast_torch.DistributedOptimizer")
        self.set_grads(flat_grad)
        self.applying = True
        try:
            self.optimizer.step()
        finally:
            self.applying = False
            self._params_current = False  # the step changed the parameters on their device

    def reset_optimizer(self) -> None:
        if self.optimizer is not None:
            self.optimizer.state.clear()

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer's state as named arrays (a live rank gives it to a replacement of a lost rank)."""
        return {} if self.optimizer is None else optimizer_arrays(self.optimizer)

    def load_optimizer_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Take another rank's optimizer state (``optimizer_state``); the hyper-parameters stay this optimizer's."""
        if self.optimizer is not None:
            groups = self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": optimizer_state(arrays), "param_groups": groups})

    def _check_storage(self) -> None:
        for param, view in zip(self.params_list, self._param_views, strict=True):
            if param.data_ptr() != view.data_ptr():
                raise RuntimeError(
                    "a parameter no longer lives in fast_torch's buffer (was the model moved with .to() or were "
                    "its parameters replaced after wrapping?); wrap the model again after moving it"
                )
