"""The one sharding rule (fast_core.data.sharding); tests/tf_adapter/test_cross_framework_shards.py checks that the
three adapters' shard() follow it (the tox env with all three frameworks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fast_core.data.sharding import shard_indices


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
