"""Horovod's ``hvd.Compression``: the same names, so scripts that pass ``compression=hvd.Compression.fp16`` run.

Under fp16 ``DistributedOptimizer`` runs all-reduce as ``allreduce:compress=fp16`` (the gradients summed in a ring
of fp16 messages, ``fast_core.compression.ring``); a metric's ``allreduce`` sends the tensor as it is (said once, on
rank 0). ``compress``/``decompress`` work as Horovod's do for scripts that call them directly.
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Horovod's compressor interface: ``compress(tensor) -> (tensor, context)``, ``decompress(tensor, context)``."""

    wire = "none"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class NoneCompressor(Compressor):
    """No compression (Horovod's default)."""


class FP16Compressor(Compressor):
    """Floating tensors cast to float16 for the wire, and back to their own dtype."""

    wire = "fp16"

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """``hvd.Compression.none`` and ``hvd.Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor

