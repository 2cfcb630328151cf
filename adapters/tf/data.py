"""Each rank's own part of the training data, for NumPy arrays and tf.data datasets (DistributedSampler's idea),
and an endless feed of full batches from it for training under a work budget."""

from __future__ import annotations

import functools
import sys
from typing import Any

import keras
import numpy as np

from fast_core import Engine
from fast_core.data.sharding import shard_arrays, shard_indices, shard_size
from fast_core.runtime.process import init


def shard(
    *data: Any,
    seed: int = 0,
    drop_last: bool = False,
    shuffle: bool = True,
    epoch: int = 0,
    engine: Engine | None = None,
) -> Any:
    """This rank's share of ``data``: arrays of the same length (x, y, sample weights...) or one tf.data dataset.

    The rule every adapter uses (``fast_core.data.sharding.shard_indices``, torch's DistributedSampler's): the samples
    in a seeded order (``seed + epoch``; ``shuffle=False``: as given) dealt round-robin, in equal shares, so every
    rank runs the same number of steps per epoch, which synchronous strategies need (``fast_tf.Callback`` checks
    it). ``drop_last=False`` repeats up to ``size - 1`` samples to get equal shares, ``drop_last=True`` leaves up
    to ``size - 1`` out. One array in, one array out; several in, a tuple out.

    A dataset is dealt in its own order (shuffle it before ``shard`` with a fixed seed, or after): the same
    indices as arrays with ``shuffle=False``. Shard it before ``batch`` so ranks split samples, not batches. A
    dataset whose length is unknown is only dealt round-robin; give ``fit`` a ``steps_per_epoch`` then.
    """
    engine = engine or init()
    if len(data) == 1 and _is_tf_dataset(data[0]):
        return _shard_dataset(data[0], engine, drop_last)
    parts = shard_arrays(data, engine.rank, engine.size, seed, drop_last, shuffle=shuffle, epoch=epoch)
    return parts[0] if len(parts) == 1 else parts


def _is_tf_dataset(data: Any) -> bool:
    """A tf.data dataset, recognised without importing TensorFlow (other Keras backends may not load it)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(data, tf.data.Dataset)


def _shard_dataset(dataset: Any, engine: Engine, drop_last: bool) -> Any:
    """``shard_indices(n, rank, size, shuffle=False)`` on a dataset: pad with its start, or cut, then deal."""
    length = int(dataset.cardinality())
    if length >= 0:  # negative: infinite or unknown
        shard_indices(length, engine.rank, engine.size, drop_last=drop_last)  # the rule's checks (enough samples)
        total = shard_size(length, engine.size, drop_last) * engine.size
        dataset = dataset.take(total) if total <= length else dataset.repeat().take(total)
    return dataset.shard(engine.size, engine.rank)


class Batches(keras.utils.PyDataset):
    """An endless ``model.fit`` input of full batches from this rank's arrays (its shard), for a work budget.

    ``model.fit(fast_tf.Batches(x, y, batch_size=32), steps_per_epoch=batches.steps, epochs=<enough>,
    shuffle=False, callbacks=[fast_tf.Callback(..., batch_size=32, budget=...)])``. The arrays are read as one
    stream: each pass over them in a fresh seeded order (``seed`` and the pass number), passes back to back, cut
    into batches of exactly ``batch_size``, so every batch holds what the callback claims and no sample is left
    out (a batch may span two passes). ``steps`` is the batches of one pass (at least 1): with it as
    ``steps_per_epoch`` a Keras epoch is about one pass. Batch ``i`` depends on ``i`` only, so Keras may fetch
    ahead on any backend; ``shuffle=False`` in ``fit`` stops Keras warning that it cannot shuffle an endless feed.
    """

    def __init__(self, *arrays: Any, batch_size: int, seed: int = 0) -> None:
        super().__init__()  # one worker, no multiprocessing: Keras reads batches in order
        if not 1 <= len(arrays) <= 3:
            raise TypeError(f"Batches(x, y[, sample_weight], batch_size=...) takes 1 to 3 arrays, got {len(arrays)}")
        self.arrays = tuple(np.asarray(a) for a in arrays)
        lengths = sorted({len(a) for a in self.arrays})
        if len(lengths) != 1 or lengths[0] == 0:
            raise ValueError(f"Batches needs arrays of one length >= 1 (samples along axis 0), got lengths {lengths}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"Batches(batch_size={batch_size!r}): give the samples of each batch, >= 1")
        self.samples = lengths[0]
        self.batch_size = int(batch_size)
        self.seed = seed
        self.steps = max(1, self.samples // self.batch_size)
        """Batches of one pass over the arrays: the ``steps_per_epoch`` to give ``fit``."""
        self._order = functools.lru_cache(maxsize=4)(self._permutation)

    @property
    def num_batches(self) -> None:
        return None  # endless: Keras asks for batch 0, 1, 2, ... and the fit's callback says when to stop

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        start, stop = index * self.batch_size, (index + 1) * self.batch_size
        pieces = []
        while start < stop:
            passes, offset = divmod(start, self.samples)
            take = min(stop - start, self.samples - offset)
            pieces.append(self._order(passes)[offset : offset + take])
            start += take
        index_array = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return tuple(a[index_array] for a in self.arrays)

    def _permutation(self, passes: int) -> np.ndarray:
        return np.random.default_rng([self.seed, passes]).permutation(self.samples)
