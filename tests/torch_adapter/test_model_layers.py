"""fast_torch.model_layers: a torch module's layers for fast model, counted by hand."""

from __future__ import annotations

import pytest
import torch

import fast_torch
from fast_core.perfmodel import Machine, predict


def test_a_convnet_s_layers_are_counted_as_by_hand() -> None:
    module = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),  # 8 x 28 x 28 outputs, 9 multiply-adds each
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 14 * 14, 10),
    )
    conv, dense = fast_torch.model_layers(module, (1, 28, 28))
    assert (conv.flops, conv.params, conv.inputs, conv.outputs) == (2 * 9 * 8 * 28 * 28, 8 * 9 + 8, 784, 8 * 784)
    assert (dense.flops, dense.params, dense.inputs, dense.outputs) == (2 * 1568 * 10, 1568 * 10 + 10, 1568, 10)
    step = predict("allreduce", [conv, dense], 32, 4, Machine())
    assert step.step > step.compute > 0


def test_a_module_without_costable_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="no Linear or Conv"):
        fast_torch.model_layers(torch.nn.ReLU(), (4,))
