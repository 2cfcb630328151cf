"""Where a torch model's parameters live for fast_core: one flat tensor per (device, dtype) group, the parameters
and gradients views of it, and the host buffers of the mixing dtype that the strategies read and write.

On the CPU with one float32/float64 dtype the host buffer *is* the model's storage (zero copy, nothing to stage).
Anywhere else (a CUDA or other device, float16/bfloat16 parameters, several dtypes, or a mixing precision other
than the parameters') the host buffers are separate: a read stages the groups device -> host, casting to the
mixing dtype, and a write stages host -> device, casting back to each group's own dtype. The host buffers are
pinned when the model is on a CUDA device, and the copies run on a side stream: the device -> host copy waits for
the compute already queued (the optimizer's step), the host -> device copy is queued before the next compute.
Reads and writes happen only when a strategy asks (``TorchModel`` keeps the staged copy for the length of one
hook), so a step where the strategy does not mix copies nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import torch

MIXING = (torch.float32, torch.float64)
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def mixing_dtype(params: Sequence[torch.Tensor], precision: str | torch.dtype | None) -> torch.dtype:
    """The dtype strategies mix in: ``precision`` if given, the parameters' own if they share float32 or float64,
    else float32 (float16/bfloat16 or several dtypes)."""
    if precision is not None:
        chosen = getattr(torch, precision) if isinstance(precision, str) and hasattr(torch, precision) else precision
        if chosen not in MIXING:
            raise ValueError(f"precision={precision!r}: FAST mixes in 'float32' or 'float64'")
        return chosen
    dtypes = {p.dtype for p in params}
    return dtypes.pop() if len(dtypes) == 1 and next(iter(dtypes)) in MIXING else torch.float32


class Groups:
    """The parameters packed into one flat tensor per (device, dtype), in order of first appearance; ``order`` is
    the parameters' order in the host buffer (group after group), ``slices`` each group's part of it."""

    def __init__(self, params: Sequence[torch.nn.Parameter], mixing: torch.dtype) -> None:
        keys: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for index, param in enumerate(params):
            keys.setdefault((param.device, param.dtype), []).append(index)
        self.order = [i for members in keys.values() for i in members]
        self.mixing = mixing
        self.flats: list[torch.Tensor] = []
        self.grad_flats: list[torch.Tensor] = []
        self.slices: list[slice] = []
        self.param_views: list[torch.Tensor] = [None] * len(params)  # type: ignore[list-item]
        self.grad_views: list[torch.Tensor] = [None] * len(params)  # type: ignore[list-item]
        start = 0
        with torch.no_grad():
            for (device, dtype), members in keys.items():
                total = sum(params[i].numel() for i in members)
                flat = torch.empty(total, dtype=dtype, device=device)
                grad_flat = torch.zeros(total, dtype=dtype, device=device)
                offset = 0
                for i in members:
                    param, n = params[i], params[i].numel()
                    view = flat[offset : offset + n].view(param.shape)
                    view.copy_(param)
                    param.data = view  # the parameter now lives in the group's flat tensor
                    grad = grad_flat[offset : offset + n].view(param.shape)
                    if param.grad is not None:
                        grad.copy_(param.grad)
                    param.grad = grad
                    self.param_views[i], self.grad_views[i] = view, grad
                    offset += n
                self.flats.append(flat)
                self.grad_flats.append(grad_flat)
                self.slices.append(slice(start, start + total))
                start += total
        self.size = start
        only = keys and len(keys) == 1 and next(iter(keys)) == (torch.device("cpu"), mixing)
        self.zero_copy = bool(only)
        devices = {device for device, _ in keys}
        self.cuda = any(device.type == "cuda" for device in devices)
        one_gpu = self.cuda and len(devices) == 1 and torch.cuda.is_available()
        self._stream = torch.cuda.Stream(device=self.flats[0].device) if one_gpu else None

    def host_buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(params, grads) on the host in the mixing dtype: the flat tensors themselves when zero-copy, else new
        buffers (pinned for a CUDA model, so the copies can be asynchronous)."""
        if self.zero_copy:
            return self.flats[0], self.grad_flats[0]
        pin = self.cuda and torch.cuda.is_available()
        return (
            torch.zeros(self.size, dtype=self.mixing, pin_memory=pin),
            torch.zeros(self.size, dtype=self.mixing, pin_memory=pin),
        )

    def to_host(self, sources: list[torch.Tensor], host: torch.Tensor) -> None:
        """Copy each group's flat tensor into its slice of ``host`` (cast to the mixing dtype); returns once done."""
        stream = self._stream
        if stream is None:
            for source, part in zip(sources, self.slices, strict=True):
                host[part].copy_(source)
            return
        stream.wait_stream(torch.cuda.current_stream(stream.device))  # after the queued compute (the step)
        with torch.cuda.stream(stream):
            for source, part in zip(sources, self.slices, strict=True):
                host[part].copy_(source.to(self.mixing), non_blocking=True)
        stream.synchronize()

    def to_device(self, host: torch.Tensor, targets: list[torch.Tensor]) -> None:
        """Copy each slice of ``host`` into its group's flat tensor (cast to the group's dtype), ordered before any
        compute queued afterwards; the host buffer may be rewritten once this returns."""
        stream = self._stream
        if stream is None:
            for target, part in zip(targets, self.slices, strict=True):
                target.copy_(host[part])
            return
        stream.wait_stream(torch.cuda.current_stream(stream.device))  # not before the compute that reads them
        with torch.cuda.stream(stream):
            for target, part in zip(targets, self.slices, strict=True):
                target.copy_(host[part], non_blocking=True)
        torch.cuda.current_stream(stream.device).wait_stream(stream)
        stream.synchronize()  # the pinned buffer is the strategies' again: it must not change under the copy


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host NumPy copy of any tensor: CUDA tensors come to the CPU, bfloat16 (which NumPy lacks) as float32."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy()
