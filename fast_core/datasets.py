"""Data that needs no download: a synthetic task for tests, scikit-learn's digits, and per-rank sharding."""

from __future__ import annotations

import numpy as np


def synthetic_classification(
    n_samples: int = 4000, n_features: int = 20, n_classes: int = 4, seed: int = 0, noise: float = 1.5
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters around random centres: linearly separable up to ``noise``, deterministic per seed."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 2.0, (n_classes, n_features))
    y = rng.integers(0, n_classes, n_samples)
    x = centres[y] + rng.normal(0.0, noise, (n_samples, n_features))
    return x.astype(np.float64), y.astype(np.int64)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 real 8x8 handwritten digits, scaled to [0, 1] (ships inside the wheel)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError("the digits data needs scikit-learn: pip install 'fast-training[examples]'") from exc
    data = load_digits()
    return (data.data / 16.0).astype(np.float64), data.target.astype(np.int64)


def train_test_split(
    x: np.ndarray, y: np.ndarray, test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic shuffled split (the same on every rank for the same seed)."""
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - test_fraction))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def shard_indices(n: int, rank: int, size: int, seed: int = 0, drop_last: bool = False) -> np.ndarray:
    """This rank's share of ``n`` samples: a seeded permutation dealt round-robin, as DistributedSampler does.

    Shards differ by at most one sample; ``drop_last`` trims them all to the same length.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    order = np.random.default_rng(seed).permutation(n)
    mine = order[rank::size]
    return mine[: n // size] if drop_last else mine


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, epoch: int = 0, seed: int = 0):
    """Mini-batches of one shard in a seeded order that changes every epoch."""
    order = np.random.default_rng((seed, epoch)).permutation(len(y))
    for start in range(0, len(y) - batch_size + 1, batch_size):
        idx = order[start : start + batch_size]
        yield x[idx], y[idx]
