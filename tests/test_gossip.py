"""Single-process tests of gossiping SGD: option errors, repr, the seeded choices, one-rank behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from fast_core import ConfigError
from fast_core.strategies import make_strategy
from fast_core.strategies.gossip import Gossip, peer_choices


def test_unknown_variant_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"'pull' or 'push', got 'pushpull'"):
        Gossip("pushpull")


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_bad_seed_is_a_config_error(seed: object) -> None:
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        Gossip(seed=seed)  # type: ignore[arg-type]


def test_defaults_and_repr() -> None:
    assert Gossip.name == "gossip"
    assert repr(Gossip()) == "Gossip(variant='pull', synchronous=True, seed=0, compress='none')"
    pushed = "Gossip(variant='push', synchronous=False, seed=3, compress='none')"
    assert repr(Gossip("push", synchronous=False, seed=3)) == pushed
    strategy = Gossip("push")
    assert make_strategy(strategy) is strategy


def test_peer_choices_are_shared_uniform_and_include_self() -> None:
    size = 4
    np.testing.assert_array_equal(peer_choices(7, 3, size), peer_choices(7, 3, size))  # what every rank computes
    assert not np.array_equal(peer_choices(7, 3, 64), peer_choices(7, 4, 64))
    assert not np.array_equal(peer_choices(7, 3, 64), peer_choices(8, 3, 64))
    draws = np.stack([peer_choices(0, step, size) for step in range(2000)])
    assert draws.min() == 0 and draws.max() == size - 1
    for rank in range(size):
        counts = np.bincount(draws[:, rank], minlength=size)
        assert np.all(np.abs(counts / 2000 - 1 / size) < 0.04), (rank, counts)  # itself as often as any other
    assert np.all(peer_choices(0, 0, 1) == 0)
