"""Which samples each rank trains on: one rule for fast_torch, fast_tf and fast_jax (and NumPy scripts).

The rule is torch's ``DistributedSampler``'s: order the ``n`` samples (a seeded permutation, or as given), make the
order a multiple of ``size`` long (repeat its start, or with ``drop_last`` cut its tail), and deal it round-robin:
rank ``r`` takes positions ``r, r + size, ...``. Every rank gets the same number of samples, so every rank runs
the same number of steps per epoch: lockstep strategies (all-reduce, D-PSGD, FAST) wait for every rank at every
step, and a rank with one batch more would wait forever. Padding is the default, as in ``DistributedSampler``:
every sample is trained on every epoch, at the cost of at most ``size - 1`` samples seen twice; ``drop_last``
instead leaves at most ``size - 1`` samples out (a different few each epoch when shuffled) and no sample twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def shard_size(n: int, size: int, drop_last: bool = False) -> int:
    """How many samples each of ``size`` ranks gets out of ``n`` (the same for every rank)."""
    return n // size if drop_last else -(-n // size)


def shard_indices(
    n: int, rank: int, size: int, seed: int = 0, drop_last: bool = False, *, shuffle: bool = True, epoch: int = 0
) -> np.ndarray:
    """The indices (into ``n`` samples) that ``rank`` of ``size`` trains on, in training order.

    ``shuffle``: deal a permutation seeded by ``seed + epoch`` (the same on every rank, a new one per epoch, as
    ``DistributedSampler.set_epoch``), else the samples in order. ``drop_last=False`` pads the order with its own
    start so all shards hold ``ceil(n / size)``; ``drop_last=True`` cuts it to ``floor(n / size)`` each. Shards are
    disjoint apart from the padding, and together cover every sample (with padding) or all but ``n % size``.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}: pass this process's rank and the job's size")
    if n < size:
        raise ValueError(
            f"{n} samples cannot be shared by {size} ranks; every rank needs at least one: use more data or fewer ranks"
        )
    order = np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n)
    total = shard_size(n, size, drop_last) * size
    order = np.resize(order, total)  # cuts the tail, or repeats the start cyclically, as DistributedSampler pads
    return order[rank::size]


def shard_by_label(labels: Sequence[Any], rank: int, size: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """The indices ``rank`` trains on when shards are split by label (not identically distributed): the samples
    ordered by label are cut into ``size`` equal runs, so each rank sees a few classes (one of 10 classes on 10
    ranks, two or three on 4), shuffled within the shard by ``seed + epoch``. Equal lengths, padded as
    :func:`shard_indices` pads, keep lockstep strategies in step. For studying what non-IID data does to
    decentralized training (``tracking`` corrects for it); never the default."""
    labels = np.asarray(labels).reshape(-1)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}: pass this process's rank and the job's size")
    if len(labels) < size:
        raise ValueError(f"{len(labels)} samples cannot be shared by {size} ranks; every rank needs at least one")
    count = shard_size(len(labels), size)
    order = np.resize(np.argsort(labels, kind="stable"), count * size)
    mine = order[rank * count : (rank + 1) * count]
    return np.random.default_rng(seed + epoch).permutation(mine)


def shard_arrays(
    arrays: Sequence[Any], rank: int, size: int, seed: int = 0, drop_last: bool = False, **rule: Any
) -> tuple[np.ndarray, ...]:
    """``rank``'s share of equally long arrays (samples on axis 0), the same samples of each: x, y stay paired.

    ``rule``: ``shuffle`` and ``epoch`` of :func:`shard_indices`.
    """
    if not arrays:
        raise ValueError("shard() needs the data to split: arrays of one length, e.g. x, y = shard(x, y)")
    hosts = [np.asarray(a) for a in arrays]
    lengths = sorted({len(a) for a in hosts})
    if len(lengths) != 1:
        raise ValueError(f"the arrays to shard have different lengths {lengths}: give arrays of one length (axis 0)")
    mine = shard_indices(lengths[0], rank, size, seed, drop_last, **rule)
    return tuple(a[mine] for a in hosts)
