"""Whole-job helpers over pytrees: broadcast (rank 0's values everywhere), sum (e.g. counts) and shard (this rank's
data)."""

from __future__ import annotations

from typing import Any

import numpy as np

import jax
import jax.numpy as jnp
from fast_core import Engine
from fast_core.data.sharding import shard_arrays
from fast_core.engine.collectives import broadcast_arrays, sum_arrays
from fast_core.runtime.process import init

from .flat import host_leaves


def broadcast(tree: Any, root: int = 0, engine: Engine | None = None) -> Any:
    """``root``'s values of ``tree`` on every rank (collective): any pytree of arrays, any dtypes (opt_state too).

    All leaves travel as one byte buffer in one broadcast, after a check that every rank holds the same leaves.
    ``fast_jax.distributed`` already does this for params and opt_state when training starts.
    """
    engine = engine or init()
    _, arrays, treedef = host_leaves(tree, engine)
    return jax.tree_util.tree_unflatten(treedef, jax.device_put(broadcast_arrays(arrays, engine, root)))


def sum(tree: Any, engine: Engine | None = None) -> Any:  # noqa: A001 - Horovod's and torch.distributed's name
    """The sum over ranks of every leaf of ``tree`` (collective, one float64 message; each leaf back in its own
    dtype, integers exact below 2**53), e.g. ``fast_jax.sum({"correct": correct, "seen": seen})``."""
    engine = engine or init()
    _, arrays, treedef = host_leaves(tree, engine)
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(a) for a in sum_arrays(arrays, engine)])


def shard(
    *arrays: np.ndarray,
    seed: int = 0,
    drop_last: bool = False,
    shuffle: bool = True,
    epoch: int = 0,
    engine: Engine | None = None,
) -> tuple[np.ndarray, ...]:
    """This rank's share of equally long arrays (e.g. ``x, y = shard(x, y)``), the same samples for each array.

    The rule every adapter uses (``fast_core.data.sharding.shard_indices``, torch's DistributedSampler's): equal shares
    on every rank, so lockstep strategies run the same number of steps; ``drop_last=False`` repeats up to
    ``size - 1`` samples to get there, ``drop_last=True`` leaves up to ``size - 1`` out.
    """
    engine = engine or init()
    return shard_arrays(arrays, engine.rank, engine.size, seed, drop_last, shuffle=shuffle, epoch=epoch)
