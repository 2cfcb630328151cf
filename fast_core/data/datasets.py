"""Data that needs no download: a synthetic task for tests, scikit-learn's digits, MNIST-1D made locally, the
examples' shared task, and per-rank sharding."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fast_core.data.sharding import shard_indices as shard_indices  # the adapters' rule, here for NumPy scripts

Split = tuple[np.ndarray, np.ndarray]


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


def mnist1d(seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-1D (Greydanus 2020): 5,000 one-dimensional digit signals of length 40, generated here by the
    ``mnist1d`` package's ``make_dataset`` (about 1 s; its download path is never used)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise ImportError("MNIST-1D needs the mnist1d package: pip install 'fast-training[examples]'") from exc
    args = get_dataset_args()
    args.seed = seed
    state = np.random.get_state()  # make_dataset seeds NumPy's global generator; leave the caller's alone
    try:
        data = make_dataset(args)
    finally:
        np.random.set_state(state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float64)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y


@dataclass(frozen=True)
class Task:
    """The examples' classification task, split the same way on every rank and in every framework."""

    name: str
    train: Split
    validation: Split
    test: Split
    sample_shape: tuple[int, ...]  # one sample without a channel axis: (8, 8) for digits, (40,) for MNIST-1D
    classes: int = 10


TASKS = ("digits", "mnist1d")


def example_task(name: str = "digits", seed: int = 0, test_fraction: float = 0.2, val_fraction: float = 0.1) -> Task:
    """``digits`` (1,797 real 8x8 images) or ``mnist1d`` (5,000 signals) as float32 (N, features) arrays and
    int64 labels, split into train, validation (held out for FAST's best-replica choice) and test."""
    if name == "digits":
        x, y = digits()
        shape: tuple[int, ...] = (8, 8)
    elif name == "mnist1d":
        x, y = mnist1d()
        shape = (40,)
    else:
        raise ValueError(f"unknown example task '{name}'; choose one of: {', '.join(TASKS)}")
    x = x.astype(np.float32)
    x_train, y_train, x_test, y_test = train_test_split(x, y, test_fraction=test_fraction, seed=seed)
    x_train, y_train, x_val, y_val = train_test_split(x_train, y_train, test_fraction=val_fraction, seed=seed + 1)
    return Task(name, (x_train, y_train), (x_val, y_val), (x_test, y_test), shape)


def train_test_split(
    x: np.ndarray, y: np.ndarray, test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic shuffled split (the same on every rank for the same seed)."""
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(len(y) * (1 - test_fraction))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, epoch: int = 0, seed: int = 0):
    """Mini-batches of one shard in a seeded order that changes every epoch."""
    order = np.random.default_rng((seed, epoch)).permutation(len(y))
    for start in range(0, len(y) - batch_size + 1, batch_size):
        idx = order[start : start + batch_size]
        yield x[idx], y[idx]
