"""NumPy references the fast_jax tests compare with: what D-PSGD and all-reduce must compute from the gradients
each rank reported."""

from __future__ import annotations

import numpy as np

from fast_core.topology import make_topology


def dpsgd_reference(starts: np.ndarray, grads: list[list[np.ndarray]], topology: str, lr: float) -> np.ndarray:
    """Every rank's params after D-PSGD: X <- W_k X - lr G_k, with ``grads[rank][k]`` the gradient of step k."""
    graph = make_topology(topology, len(starts))
    states = np.array(starts, dtype=np.float64)
    for k in range(len(grads[0])):
        states = graph.mixing_matrix(k) @ states - lr * np.stack([g[k] for g in grads])
    return states


def allreduce_momentum_reference(
    start: np.ndarray, grads: list[list[np.ndarray]], lr: float, momentum: float
) -> tuple[np.ndarray, np.ndarray]:
    """(params, velocity) of one model on the mean gradient with optax's SGD trace: v <- g + mu v, x <- x - lr v."""
    params, velocity = np.array(start, dtype=np.float64), np.zeros_like(start, dtype=np.float64)
    for k in range(len(grads[0])):
        velocity = np.mean([g[k] for g in grads], axis=0) + momentum * velocity
        params -= lr * velocity
    return params, velocity
