"""The adapter contract: all a strategy may ask of a framework's model and optimizer."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from fast_core.model.flat import FlatLayout


@runtime_checkable
class ModelAdapter(Protocol):
    """A model seen as flat NumPy buffers, plus the user's optimizer.

    ``params()`` and ``grads()`` may return live views (torch on CPU) or copies (JAX); strategies always write
    results back with ``set_params``/``set_grads``, which adapters make free when given their own view.
    """

    layout: FlatLayout

    def params(self) -> np.ndarray:
        """Current parameters as one flat buffer of ``layout``."""

    def set_params(self, flat: np.ndarray) -> None:
        """Load a flat buffer into the model's parameters."""

    def grads(self) -> np.ndarray:
        """Gradients of the last backward pass as one flat buffer (zeros where a parameter got none)."""

    def set_grads(self, flat: np.ndarray) -> None:
        """Replace the gradients the optimizer is about to use."""

    def apply_gradient(self, flat_grad: np.ndarray) -> None:
        """Take one step of the user's (stateful) optimizer with this gradient, e.g. a neighbour's for FAST."""

    def reset_optimizer(self) -> None:
        """Clear the optimizer's state (momentum, AdaGrad sums): FAST's best-replica restart may ask for it."""
