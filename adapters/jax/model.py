"""fast_core's adapter contract over a JAX params pytree (and, in the gradient form, its gradients and optax).

JAX arrays are immutable, so the adapter keeps host copies and moves data lazily: ``params()`` copies the device
pytree to the host buffer only when the device holds newer values, and ``set_params`` only marks the host newer;
the device pytree is rebuilt (one transfer) when the step hands parameters back. A strategy that does not touch
the parameters on a step (local SGD between averagings, ``every=k``) costs no transfer at all.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import optax

import jax

from .flat import FlatTree


class _Mirror:
    """One pytree on the device and its flat host copy, each marked stale when the other is newer."""

    def __init__(self, flat: FlatTree, what: str) -> None:
        self.flat = flat
        self.what = what
        self.tree: Any = None
        self.host = flat.layout.empty()
        self.host_current = False  # host buffer holds the tree's values
        self.device_current = True  # tree holds the host buffer's values

    def load(self, tree: Any) -> None:
        if tree is not self.tree or not self.device_current:
            self.tree = tree
            self.host_current = False
            self.device_current = True

    def numpy(self) -> np.ndarray:
        if not self.host_current:
            self.flat.to_numpy(self.tree, out=self.host, what=self.what)
            self.host_current = True
        return self.host

    def set_numpy(self, flat: np.ndarray) -> None:
        if flat is not self.host:
            np.copyto(self.host, flat)
        self.host_current = True
        self.device_current = False

    def device(self) -> Any:
        if not self.device_current:
            self.tree = self.flat.from_numpy(self.host)
            self.device_current = True
        return self.tree


@lru_cache(maxsize=16)  # one compiled update per optimizer, however many models or runs use it
def _optax_step(optimizer: optax.GradientTransformation):
    def step(params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step)


class JaxModel:
    """Params (and gradients) of one rank as flat host buffers, plus the user's optax optimizer when given.

    Between the hooks of a step the model holds the step's ``params`` and ``opt_state``; ``apply_gradient`` runs
    the same jitted optax update the rank's own gradient goes through (FAST applies neighbours' gradients so).
    """

    def __init__(self, flat: FlatTree, optimizer: optax.GradientTransformation | None = None) -> None:
        self.flat = flat
        self.layout = flat.layout
        self.optimizer = optimizer
        self.opt_state: Any = None
        self._params = _Mirror(flat, "params")
        self._grads = _Mirror(flat, "gradients") if optimizer is not None else None
        self._update = _optax_step(optimizer) if optimizer is not None else None

    # what the step uses -----------------------------------------------------------------------------------------
    def load(self, params: Any, opt_state: Any) -> None:
        """Take the params and optimizer state the step works on (no copy)."""
        self._params.load(params)
        self.opt_state = opt_state

    def params_tree(self) -> Any:
        """The current params pytree, with whatever a strategy wrote into the host buffer."""
        return self._params.device()

    def load_grads(self, grads: Any) -> None:
        self._gradient_form()._grads.load(grads)

    def apply_own_gradient(self) -> None:
        """One optimizer step with this rank's gradient (as a strategy left it)."""
        self._apply(self._gradient_form()._grads.device())

    # adapter contract -------------------------------------------------------------------------------------------
    def params(self) -> np.ndarray:
        return self._params.numpy()

    def set_params(self, flat: np.ndarray) -> None:
        self._params.set_numpy(flat)

    def grads(self) -> np.ndarray:
        return self._gradient_form()._grads.numpy()

    def set_grads(self, flat: np.ndarray) -> None:
        self._gradient_form()._grads.set_numpy(flat)

    def apply_gradient(self, flat_grad: np.ndarray) -> None:
        """One step of the user's optax optimizer with a flat gradient, e.g. a neighbour's for FAST."""
        self._gradient_form()
        self._apply(self.flat.from_numpy(np.ascontiguousarray(flat_grad, dtype=self.layout.dtype)))

    def reset_optimizer(self) -> None:
        """Fresh optimizer state for the current params (FAST's restart may ask for it)."""
        self.opt_state = self._gradient_form().optimizer.init(self.params_tree())

    # ------------------------------------------------------------------------------------------------------------
    def _apply(self, grads: Any) -> None:
        params, self.opt_state = self._update(self.params_tree(), self.opt_state, grads)
        self._params.load(params)

    def _gradient_form(self) -> JaxModel:
        if self.optimizer is None:
            raise RuntimeError(
                "this strategy needs gradients and the optimizer: wrap a grad_step(params, batch) -> (grads, "
                "metrics) with fast_jax.distributed(grad_step, strategy, optimizer=<optax transformation>)"
            )
        return self
