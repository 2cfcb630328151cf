"""A torch.nn.Module seen through fast_core's adapter contract, with zero-copy parameters on the CPU.

At wrap time every trainable parameter is moved into one contiguous tensor and replaced by a view of it, and
likewise its gradient, so the NumPy buffers fast_core mixes are the model's own storage: no copy per step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import torch
from fast_core.flat import FlatLayout

from .optim_state import optimizer_arrays, optimizer_state


def trainable_parameters(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """Named parameters that require grad, each once (tied weights appear under their first name)."""
    seen: set[int] = set()
    for name, param in module.named_parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            yield name, param


def _check(named: list[tuple[str, torch.nn.Parameter]]) -> torch.dtype:
    if not named:
        raise ValueError("the model has no parameter that requires grad: there is nothing to train or average")
    devices = {str(p.device) for _, p in named}
    if devices != {"cpu"}:
        name, param = next((n, p) for n, p in named if p.device.type != "cpu")
        raise ValueError(
            f"parameter '{name}' is on {param.device}; fast_torch keeps parameters in one CPU buffer shared with "
            "NumPy, so train on the CPU (model.to('cpu')) — GPU models are not supported yet"
        )
    dtypes = {p.dtype for _, p in named}
    if len(dtypes) > 1:
        kinds = ", ".join(sorted(str(d) for d in dtypes))
        raise TypeError(
            f"parameters have several dtypes ({kinds}); fast_torch keeps them in one buffer, so convert the model "
            "to one dtype first, e.g. model.float() or model.double()"
        )
    dtype = dtypes.pop()
    if not dtype.is_floating_point or dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"parameters are {dtype}; fast_torch supports float32 and float64")
    return dtype


class TorchModel:
    """Flat, zero-copy views of a module's trainable parameters and gradients, plus its optimizer."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        named = list(trainable_parameters(module))
        dtype = _check(named)
        self.module = module
        self.optimizer = optimizer
        self.applying = False  # True while apply_gradient runs the optimizer for a neighbour's gradient
        self.params_list = [p for _, p in named]
        self.layout = FlatLayout([(n, tuple(p.shape), str(dtype).removeprefix("torch.")) for n, p in named])
        total = self.layout.size
        self._flat = torch.empty(total, dtype=dtype)
        self._flat_grad = torch.zeros(total, dtype=dtype)
        self._param_views: list[torch.Tensor] = []
        self._grad_views: list[torch.Tensor] = []
        with torch.no_grad():
            for entry, param in zip(self.layout.entries, self.params_list, strict=True):
                view = self._flat[entry.offset : entry.offset + entry.size].view(entry.shape)
                view.copy_(param)
                param.data = view  # the parameter now lives in the flat buffer
                grad = self._flat_grad[entry.offset : entry.offset + entry.size].view(entry.shape)
                if param.grad is not None:
                    grad.copy_(param.grad)
                param.grad = grad
                self._param_views.append(view)
                self._grad_views.append(grad)
        self._params_np = self._flat.numpy()
        self._grads_np = self._flat_grad.numpy()

    # adapter contract -------------------------------------------------------------------------------------------
    def params(self) -> np.ndarray:
        self._check_storage()
        return self._params_np

    def set_params(self, flat: np.ndarray) -> None:
        if flat is not self._params_np:
            np.copyto(self._params_np, flat)

    def grads(self) -> np.ndarray:
        """The gradients as one flat buffer; gradients torch re-allocated (zero_grad(set_to_none=True)) are
        copied back in and their views restored, so the next step is zero-copy again."""
        self._check_storage()
        with torch.no_grad():
            for param, view in zip(self.params_list, self._grad_views, strict=True):
                grad = param.grad
                if grad is None:
                    view.zero_()
                elif grad.data_ptr() != view.data_ptr():
                    view.copy_(grad)
                if grad is None or grad.data_ptr() != view.data_ptr():
                    param.grad = view
        return self._grads_np

    def set_grads(self, flat: np.ndarray) -> None:
        if flat is not self._grads_np:
            np.copyto(self._grads_np, flat)
        self.grads()  # make sure every param.grad is the view again

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
