"""Whole-job helpers over pytrees: broadcast (rank 0's values everywhere) and shard (this rank's data)."""

from __future__ import annotations

from typing import Any

import numpy as np

import jax
from fast_core import Engine
from fast_core.collectives import broadcast_arrays
from fast_core.datasets import shard_indices
from fast_core.runtime import init

from .flat import host_leaves


def broadcast(tree: Any, root: int = 0, engine: Engine | None = None) -> Any:
    """``root``'s values of ``tree`` on every rank (collective): any pytree of arrays, any dtypes (opt_state too).

    All leaves travel as one byte buffer in one broadcast, after a check that every rank holds the same leaves.
    ``fast_jax.distributed`` already does this for params and opt_state when training starts.
    """
    engine = engine or init()
    _, arrays, treedef = host_leaves(tree, engine)
    return jax.tree_util.tree_unflatten(treedef, jax.device_put(broadcast_arrays(arrays, engine, root)))


def shard(
    *arrays: np.ndarray, seed: int = 0, drop_last: bool = False, engine: Engine | None = None
) -> tuple[np.ndarray, ...]:
    """This rank's share of equally long arrays (e.g. ``x, y = shard(x, y)``), the same samples for each array.

    A seeded permutation dealt round-robin (``fast_core.datasets.shard_indices``): shares differ by at most one
    sample; ``drop_last=True`` makes them equal, which synchronous strategies need for equal step counts.
    """
    if not arrays:
        raise ValueError("shard() needs at least one array, e.g. x, y = fast_jax.shard(x, y)")
    lengths = {len(a) for a in arrays}
    if len(lengths) > 1:
        raise ValueError(f"shard() needs arrays of one length (samples on axis 0), got lengths {sorted(lengths)}")
    engine = engine or init()
    mine = shard_indices(lengths.pop(), engine.rank, engine.size, seed=seed, drop_last=drop_last)
    return tuple(np.asarray(a)[mine] for a in arrays)
