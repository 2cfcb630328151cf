"""CHOCO-SGD (``choco:ring,compress=topk:ratio=0.1,gamma=0.5``): every parameter equal to a dense NumPy simulation
of the rule for each codec, gossip after the optimizer step when nothing is compressed, learning as D-PSGD does
with 10-20x fewer bytes, and its options checked."""

from __future__ import annotations

import numpy as np
import pytest
from cases_compose import simulate
from training import LR, task, train

from fast_core import LocalCluster, make_strategy
from fast_core.compression import make_codec
from fast_core.errors import ConfigError
from fast_core.strategies.choco import _SEED_STRIDE
from fast_core.topology import make_topology

STEPS = 40


def reference_choco(size: int, steps: int, codec: str, gamma: float) -> np.ndarray:
    """X^ <- X^ + Q(X - lr G - X^) row by row; X <- X - lr G + gamma (W - I) X^ (uniform ring: rows sum to 1)."""
    coder = make_codec(codec)
    w = make_topology("ring", size).mixing_matrix(0)
    copies: list[np.ndarray] = []

    def rule(step: int, states: np.ndarray, grads: np.ndarray) -> np.ndarray:
        if not copies:
            copies.append(states.copy())  # every public copy starts at the common start
        half = states - LR * grads
        for r in range(size):
            seed = step * _SEED_STRIDE + r
            copies[0][r] += coder.decode(coder.encode(half[r] - copies[0][r], seed), states.shape[1], seed)
        return half + gamma * (w - np.eye(size)) @ copies[0]

    return simulate(size, steps, rule)[-1]


def _run(engine, strategy: str) -> tuple[np.ndarray, int, float]:
    model, worker = train(engine, strategy, STEPS)
    _, _, _, (x_test, y_test) = task(engine.size)
    return model.params().copy(), worker.metrics.bytes_sent, model.accuracy(x_test, y_test)


@pytest.mark.parametrize(("codec", "gamma"), [("topk:ratio=0.1", 0.5), ("randomk:ratio=0.2", 0.3), ("int8", 0.8)])
def test_choco_follows_its_rule(codec: str, gamma: float) -> None:
    got = LocalCluster(4, timeout=30).run(_run, f"choco:ring,compress={codec},gamma={gamma}")
    expected = reference_choco(4, STEPS, codec, gamma)
    assert np.isfinite(expected).all()
    for rank, (params, _, _) in enumerate(got):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-5, atol=1e-6)


def test_uncompressed_choco_with_gamma_one_is_gossip_after_the_optimizer_step() -> None:
    got = LocalCluster(4, timeout=30).run(_run, "choco:ring,compress=none,gamma=1")
    w = make_topology("ring", 4).mixing_matrix(0)
    states = simulate(4, STEPS, lambda step, states, grads: w @ (states - LR * grads))[-1]
    for rank, (params, _, _) in enumerate(got):
        np.testing.assert_allclose(params, states[rank], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("codec", "fewer"), [("topk:ratio=0.1", 9.5), ("randomk:ratio=0.1", 19.0), ("topk:ratio=0.01", 80), ("int8", 7.5)]
)
def test_choco_learns_as_dpsgd_does_with_far_fewer_bytes(codec: str, fewer: float) -> None:
    plain = LocalCluster(4, timeout=30).run(_run, "dpsgd:ring")
    packed = LocalCluster(4, timeout=30).run(_run, f"choco:ring,compress={codec}")  # gamma: its default
    for (_, sent_plain, acc_plain), (_, sent, accuracy) in zip(plain, packed, strict=True):
        assert accuracy >= acc_plain - 0.03, (accuracy, acc_plain)
        assert sent_plain / sent > fewer, sent_plain / sent  # float64 parameters against the kept values


def test_choco_options_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"choco's gamma must be a number in \(0, 1\], got 1.5"):
        make_strategy("choco:ring,gamma=1.5")
    with pytest.raises(ValueError, match="unknown codec"):
        make_strategy("choco:ring,compress=int4")
    assert make_strategy("choco:ring").gamma == 0.1 and make_strategy("choco:ring,compress=fp16").gamma == 1.0

    def on_a_moving_graph(engine) -> None:
        train(engine, "choco:exp1", 1)

    with pytest.raises(ConfigError, match="choco .* needs a static topology"):
        LocalCluster(4, timeout=30).run(on_a_moving_graph)
