"""fast_jax.sum: counts and any pytree summed over ranks, each leaf back in its own dtype."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import fast_jax as fast
from fast_core.engine.local import LocalCluster


def _sum(engine) -> dict:
    r = engine.rank
    tree = {
        "correct": jnp.int32(10 * r + 3),
        "loss": jnp.float32(0.5 + r),
        "vec": jnp.arange(3, dtype=jnp.bfloat16) * r,
    }
    return fast.sum(tree, engine=engine)


def test_sum_matches_numpy_in_each_leafs_dtype() -> None:
    for result in LocalCluster(3, timeout=240).run(_sum):
        assert result["correct"].dtype == jnp.int32 and int(result["correct"]) == 3 + 13 + 23
        assert result["loss"].dtype == jnp.float32 and float(result["loss"]) == 0.5 + 1.5 + 2.5
        assert result["vec"].dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(result["vec"], dtype=np.float32), np.arange(3) * 3.0)
