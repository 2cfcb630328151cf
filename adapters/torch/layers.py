"""A torch module as ``fast model``'s list of layers: what ``fast_core.perfmodel`` needs of it, found by running one
forward pass with hooks, so the shapes are the ones the module really computes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from fast_core.perfmodel import Layer

__all__ = ["model_layers"]


def model_layers(module: torch.nn.Module, input_shape: Sequence[int]) -> list[Layer]:
    """The Linear and Conv1d/Conv2d layers of ``module`` in the order they run on one sample of ``input_shape``
    (without the batch dimension): forward flops, parameters, inputs and outputs per sample. Other modules
    (activations, pooling, normalisation) are elementwise and left to the framework's time per step that
    ``fast model --calibrate`` measures."""
    found: list[Layer] = []

    def record(layer: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        params = sum(p.numel() for p in layer.parameters(recurse=False))
        weight = layer.weight
        if isinstance(layer, torch.nn.Linear):
            flops = 2.0 * weight.shape[0] * weight.shape[1] * (output.numel() // weight.shape[0])
        else:  # a convolution: 2 x (input channels per group x kernel size) per output value
            flops = 2.0 * weight[0].numel() * output.numel()
        found.append(Layer(type(layer).__name__.lower() + str(len(found)), flops, params, inputs[0].numel(),
                           output.numel()))

    kinds = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)
    handles = [m.register_forward_hook(record) for m in module.modules() if isinstance(m, kinds)]
    try:
        with torch.no_grad():
            module(torch.zeros(1, *input_shape))
    finally:
        for handle in handles:
            handle.remove()
    if not found:
        raise ValueError(f"{type(module).__name__} has no Linear or Conv1d/Conv2d layer that fast model can cost")
    return found
