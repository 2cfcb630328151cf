"""The one sharding rule (fast_core.sharding) and the three adapters' shard(), which must all follow it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fast_core.engine.local import LocalCluster
from fast_core.sharding import shard_indices


@pytest.mark.parametrize("n,size", [(10, 3), (12, 4), (7, 2), (5, 5), (101, 8)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_are_equal_disjoint_and_cover_what_the_rule_says(n: int, size: int, drop_last: bool) -> None:
    shards = [shard_indices(n, r, size, seed=3, drop_last=drop_last) for r in range(size)]
    each = n // size if drop_last else math.ceil(n / size)
    assert [len(s) for s in shards] == [each] * size
    order = np.random.default_rng(3).permutation(n)  # the reference: DistributedSampler's rule on NumPy's order
    dealt = np.resize(order, each * size)  # padded with the order's start, or cut
    for r, s in enumerate(shards):
        np.testing.assert_array_equal(s, dealt[r::size])
    taken = np.concatenate(shards)
    if drop_last:
        assert len(set(taken.tolist())) == len(taken)  # disjoint
        assert set(taken.tolist()) == set(order[: each * size].tolist())  # all but the permutation's last n % size
    else:
        assert set(taken.tolist()) == set(range(n))  # every sample
        assert len(taken) - n == each * size - n < size  # repeated: the start of the order, fewer than size


def test_order_changes_with_seed_and_epoch_and_not_shuffled_is_round_robin() -> None:
    assert not np.array_equal(shard_indices(100, 0, 2, seed=0), shard_indices(100, 0, 2, seed=1))
    np.testing.assert_array_equal(shard_indices(100, 1, 2, seed=1), shard_indices(100, 1, 2, seed=0, epoch=1))
    np.testing.assert_array_equal(shard_indices(10, 1, 3, shuffle=False), [1, 4, 7, 0])
    np.testing.assert_array_equal(shard_indices(10, 1, 3, shuffle=False, drop_last=True), [1, 4, 7])


def test_bad_rank_or_too_few_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="rank 3 is outside 0..2"):
        shard_indices(10, 3, 3)
    with pytest.raises(ValueError, match="2 samples cannot be shared by 3 ranks"):
        shard_indices(2, 0, 3)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_torch_tf_and_jax_deal_the_same_indices(drop_last: bool, shuffle: bool) -> None:
    fast_torch = pytest.importorskip("fast_torch")
    fast_tf = pytest.importorskip("fast_tf")
    fast_jax = pytest.importorskip("fast_jax")
    import torch

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
            import tensorflow as tf

            dealt = fast_tf.shard(tf.data.Dataset.range(n), **kw)
            np.testing.assert_array_equal([int(v) for v in dealt], expected)
