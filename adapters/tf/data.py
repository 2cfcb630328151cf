"""Each rank's own part of the training data, for NumPy arrays and tf.data datasets (DistributedSampler's idea)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from fast_core import Engine
from fast_core.datasets import shard_indices
from fast_core.runtime import init


def shard(*data: Any, seed: int = 0, drop_last: bool = True, engine: Engine | None = None) -> Any:
    """This rank's share of ``data``: arrays of the same length (x, y, sample weights...) or one tf.data dataset.

    Arrays: a seeded permutation dealt round-robin (``fast_core.datasets.shard_indices``), the same on every rank,
    so shards are disjoint and cover the data; one array in, one array out, several in, a tuple out. A dataset:
    ``dataset.shard(size, rank)``; shard it before ``batch`` so ranks split samples, not batches.

    ``drop_last=True`` (the default) trims every shard to the same length, so every rank runs the same number of
    steps per epoch: synchronous strategies need that (``fast_tf.Callback`` checks it). A dataset whose length is
    unknown is only sharded; give ``fit`` a ``steps_per_epoch`` then.
    """
    engine = engine or init()
    if len(data) == 1 and _is_tf_dataset(data[0]):
        return _shard_dataset(data[0], engine, drop_last)
    if not data:
        raise TypeError("shard() needs the data to split: arrays of the same length, or one tf.data.Dataset")
    arrays = [np.asarray(a) for a in data]
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"the arrays to shard have different lengths {sorted(lengths)}; give samples along axis 0")
    n = lengths.pop()
    if n < engine.size:
        raise ValueError(f"{n} samples cannot be shared by {engine.size} ranks; every rank needs at least one")
    index = shard_indices(n, engine.rank, engine.size, seed=seed, drop_last=drop_last)
    parts = tuple(a[index] for a in arrays)
    return parts[0] if len(parts) == 1 else parts


def _is_tf_dataset(data: Any) -> bool:
    """A tf.data dataset, recognised without importing TensorFlow (other Keras backends may not load it)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def _shard_dataset(dataset: Any, engine: Engine, drop_last: bool) -> Any:
    part = dataset.shard(engine.size, engine.rank)
    length = int(dataset.cardinality())
    if drop_last and length >= 0:  # negative: infinite or unknown
        part = part.take(length // engine.size)
    return part
