"""fast_torch, fast_tf and fast_jax deal the same samples to the same rank: the one rule of fast_core.data.sharding
(here, in the tox env that has all three frameworks)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import torch

import fast_jax
import fast_tf
import fast_torch
from fast_core.data.sharding import shard_indices
from fast_core.engine.local import LocalCluster


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_torch_tf_and_jax_deal_the_same_indices(drop_last: bool, shuffle: bool) -> None:
    n, size, seed, epoch = 23, 3, 5, 2
    data = np.arange(n)
    cluster = LocalCluster(size)
    for rank in range(size):
        engine = cluster.engine(rank)
        kw = {"seed": seed, "drop_last": drop_last, "shuffle": shuffle, "epoch": epoch, "engine": engine}
        expected = shard_indices(n, rank, size, seed, drop_last, shuffle=shuffle, epoch=epoch)
        loader = fast_torch.shard(torch.utils.data.TensorDataset(torch.from_numpy(data)), batch_size=1, **kw)
        from_torch = np.concatenate([batch.numpy() for (batch,) in loader])
        (from_jax,) = fast_jax.shard(data, **kw)
        np.testing.assert_array_equal(from_torch, expected)
        np.testing.assert_array_equal(fast_tf.shard(data, **kw), expected)
        np.testing.assert_array_equal(from_jax, expected)
        if not shuffle:  # a tf.data dataset is dealt in its own order, as arrays are unshuffled
            dealt = fast_tf.shard(tf.data.Dataset.range(n), **kw)
            np.testing.assert_array_equal([int(v) for v in dealt], expected)
