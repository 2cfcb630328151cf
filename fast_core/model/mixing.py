"""In-place vector kernels for mixing flat buffers: no per-step allocation, one pass over memory each."""

from __future__ import annotations

import numpy as np
from scipy.linalg import blas

_AXPY = {np.dtype(np.float32): blas.saxpy, np.dtype(np.float64): blas.daxpy}


def axpy(alpha: float, x: np.ndarray, y: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """y += alpha * x in place (BLAS axpy for float32/64; other dtypes need a ``scratch`` buffer like ``x``)."""
    if alpha == 0.0:
        return
    kernel = _AXPY.get(y.dtype)
    if kernel is not None and x.dtype == y.dtype and y.flags.c_contiguous and x.flags.c_contiguous:
        out = kernel(x, y, a=alpha)
        if out is not y:  # BLAS wrote to a copy (cannot happen for contiguous arrays of its own dtype)
            np.copyto(y, out)
        return
    if scratch is None:
        scratch = np.empty_like(y)
    np.multiply(x, alpha, out=scratch, casting="unsafe")
    np.add(y, scratch, out=y)
