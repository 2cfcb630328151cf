"""Whole-job helpers over pytrees: broadcast (rank 0's values everywhere), average (the consensus model), shard."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import jax
import jax.numpy as jnp
from fast_core import Engine
from fast_core.datasets import shard_indices
from fast_core.flat import FlatLayout, check_same_layout
from fast_core.runtime import init

from .flat import leaf_dtype, named_leaves

if TYPE_CHECKING:
    from .step import DistributedStep


def _host_leaves(tree: Any) -> tuple[list[tuple[str, np.ndarray]], Any]:
    named, treedef = named_leaves(tree)
    return [(name, np.asarray(jax.device_get(leaf), dtype=leaf_dtype(leaf))) for name, leaf in named], treedef


def _check_same_tree(named: list[tuple[str, np.ndarray]], engine: Engine) -> None:
    """Raise on every rank, naming the first differing leaf, unless all ranks hold the same structure."""
    check_same_layout(FlatLayout([(n, a.shape, a.dtype) for n, a in named], dtype="float64"), engine)


def broadcast(tree: Any, root: int = 0, engine: Engine | None = None) -> Any:
    """``root``'s values of ``tree`` on every rank (collective): any pytree of arrays, any dtypes (opt_state too).

    All leaves travel as one byte buffer in one broadcast, after a check that every rank holds the same leaves.
    ``fast_jax.distributed`` already does this for params and opt_state when training starts.
    """
    engine = engine or init()
    named, treedef = _host_leaves(tree)
    _check_same_tree(named, engine)
    raw = np.concatenate([a.reshape(-1).view(np.uint8) for _, a in named]) if named else np.zeros(0, np.uint8)
    engine.broadcast(raw, root)
    leaves, offset = [], 0
    for _, array in named:
        leaves.append(raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape))
        offset += array.nbytes
    return jax.tree_util.tree_unflatten(treedef, jax.device_put(leaves))


def average(tree: Any, *, step: DistributedStep | None = None, engine: Engine | None = None) -> Any:
    """The mean over ranks of every leaf of ``tree`` (collective; summed in float64, returned in each leaf's dtype).

    At the end of training pass the wrapped ``step``: its worker is closed first, so no message is still in
    flight, and its engine is used. Without ``step`` it is a plain collective, e.g. to evaluate the consensus
    model mid-training.
    """
    if step is not None:
        step.close()
        engine = engine or step.engine
    engine = engine or init()
    named, treedef = _host_leaves(tree)
    for name, array in named:
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"leaf '{name}' has dtype {array.dtype}: only floating leaves can be averaged")
    _check_same_tree(named, engine)
    total = np.concatenate([a.reshape(-1) for _, a in named], dtype=np.float64) if named else np.zeros(0)
    engine.allreduce(total)
    total /= engine.size
    leaves, offset = [], 0
    for _, array in named:
        leaves.append(jnp.asarray(total[offset : offset + array.size].reshape(array.shape), dtype=array.dtype))
        offset += array.size
    return jax.tree_util.tree_unflatten(treedef, leaves)


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
