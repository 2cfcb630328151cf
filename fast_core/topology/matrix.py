"""Properties of a mixing matrix W: which sums are 1, and how fast repeated mixing reaches consensus."""

from __future__ import annotations

import numpy as np

from fast_core.topology.checks import TOL, TopologyError


def _stochastic_rows(matrix: np.ndarray, tol: float) -> bool:
    return (
        matrix.ndim == 2
        and matrix.size > 0
        and bool(np.all(matrix >= -tol))
        and bool(np.allclose(matrix.sum(axis=1), 1.0, rtol=0.0, atol=tol))
    )


def is_row_stochastic(W: np.ndarray, tol: float = TOL) -> bool:
    """Nonnegative with rows summing to 1: each rank takes a weighted average of what it receives."""
    return _stochastic_rows(np.asarray(W, dtype=np.float64), tol)


def is_column_stochastic(W: np.ndarray, tol: float = TOL) -> bool:
    """Nonnegative with columns summing to 1: each rank's mass is fully handed out (push-sum)."""
    return _stochastic_rows(np.asarray(W, dtype=np.float64).T, tol)


def is_doubly_stochastic(W: np.ndarray, tol: float = TOL) -> bool:
    """Row and column stochastic: repeated mixing converges to the exact average."""
    return is_row_stochastic(W, tol) and is_column_stochastic(W, tol)


def spectral_gap(W: np.ndarray) -> float:
    """1 - |lambda_2(W)|: how fast mixing with a stochastic W reaches consensus (1 = one step, 0 = never)."""
    matrix = np.asarray(W, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise TopologyError(f"spectral gap needs a square matrix, got shape {matrix.shape}")
    if matrix.shape[0] == 1:
        return 1.0
    symmetric = np.allclose(matrix, matrix.T, rtol=0.0, atol=1e-12)
    eigenvalues = np.linalg.eigvalsh(matrix) if symmetric else np.linalg.eigvals(matrix)
    moduli = np.sort(np.abs(eigenvalues))[::-1]
    return float(max(0.0, 1.0 - moduli[1]))  # clip rounding noise of a disconnected graph
