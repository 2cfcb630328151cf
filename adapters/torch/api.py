"""Whole-job helpers with the names Horovod users know: broadcast_parameters, average_model, shard; and
consensus_copy, the averaged model without touching this rank's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy

import torch
from fast_core import Engine
from fast_core.data.sharding import shard_indices
from fast_core.runtime.process import init as default_engine
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .optimizer import _WORKERS
from .tensors import average_tensors, broadcast_tensors, floating_tensors


def broadcast_parameters(model: torch.nn.Module, root: int = 0, engine: Engine | None = None) -> None:
    """Overwrite every rank's parameters and floating buffers with ``root``'s (collective).

    DistributedOptimizer already does this once when it wraps the model.
    """
    broadcast_tensors(floating_tensors(model), engine or default_engine(), root)


def average_model(
    model: torch.nn.Module, buffers: bool = True, engine: Engine | None = None, *, close: bool = True
) -> None:
    """Replace every rank's parameters (and floating buffers, unless ``buffers=False``) by their mean over ranks.

    Collective: the consensus model. By default it closes the model's FAST worker first (its last messages land,
    nothing stays in flight): call it after the last step, and the model every rank saves is the consensus model.
    ``close=False`` averages mid-training and leaves the worker running: every rank then continues from the
    average (a consensus step). To evaluate the consensus model without touching this rank's own, use
    :func:`consensus_copy`.
    """
    worker = _WORKERS.get(model)
    if worker is not None and close:
        worker.close()
    engine = engine or (worker.engine if worker is not None else default_engine())
    tensors = floating_tensors(model, buffers=buffers)
    if worker is not None:  # a lost rank is survived (fast run --fault-tolerant), then the survivors average
        worker.group.collective(lambda: average_tensors(tensors, worker.engine))
    else:
        average_tensors(tensors, engine)


def consensus_copy(model: torch.nn.Module, buffers: bool = True, engine: Engine | None = None) -> torch.nn.Module:
    """A copy of ``model`` holding the mean over ranks of its parameters (and floating buffers, unless
    ``buffers=False``), e.g. to evaluate the consensus model mid-training; this rank's own model and its worker
    are left as they are. Collective: every rank must call it at the same point, so under an asynchronous strategy
    the ranks wait for each other there (the slowest sets the pace once per call); ``fast_core.observers.snapshots``
    measures the consensus model over time without any wait."""
    worker = _WORKERS.get(model)
    engine = engine or (worker.engine if worker is not None else default_engine())
    copy = deepcopy(model)
    tensors = floating_tensors(copy, buffers=buffers)
    if worker is not None:
        worker.group.collective(lambda: average_tensors(tensors, worker.engine))
    else:
        average_tensors(tensors, engine)
    return copy


@contextmanager
def join(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Wrap the training loop when ranks may have different numbers of batches (as DDP's ``join``).

    Inside, lockstep strategies count the ranks still training at each step (one 8-byte allreduce); when this
    rank's data ends, it keeps taking part with a zero gradient until every rank's data has ended, so no rank
    waits forever. Asynchronous strategies need nothing and pay nothing.
    """
    worker = getattr(optimizer, "fast_worker", None)
    if worker is None:
        raise RuntimeError("join() takes the optimizer returned by fast_torch.DistributedOptimizer")
    worker.uneven_inputs = True
    yield  # an exception in the loop propagates from here, without joining
    worker.join()
    worker.uneven_inputs = False


class ShardSampler(DistributedSampler):
    """A DistributedSampler that deals the indices by ``fast_core.data.sharding.shard_indices``, so a torch rank gets
    the very samples a fast_tf or fast_jax rank gets for the same seed (torch's own permutation differs)."""

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        mine = shard_indices(
            n, self.rank, self.num_replicas, self.seed, self.drop_last, shuffle=self.shuffle, epoch=self.epoch
        )
        return iter(mine.tolist())


def shard(
    data: Dataset | DataLoader,
    *,
    seed: int = 0,
    drop_last: bool = False,
    shuffle: bool = True,
    epoch: int = 0,
    engine=None,
    **kw,
) -> DataLoader:
    """This rank's share of a dataset (or of a DataLoader's dataset), as a DataLoader with a :class:`ShardSampler`.

    The rule every adapter uses (``fast_core.data.sharding.shard_indices``, DistributedSampler's): equal shares on
    every rank, so lockstep strategies run the same number of steps; ``drop_last=False`` repeats up to ``size - 1``
    samples to get there, ``drop_last=True`` leaves up to ``size - 1`` out. Call ``loader.sampler.set_epoch(e)``
    each epoch for a new order (``epoch`` is the first one's). ``drop_last=True`` also drops the loader's last
    partial batch, as before.
    """
    engine = engine or default_engine()
    if isinstance(data, DataLoader):
        kw.setdefault("batch_size", data.batch_size)
        kw.setdefault("num_workers", data.num_workers)
        kw.setdefault("collate_fn", data.collate_fn)
        data = data.dataset
    shard_indices(len(data), engine.rank, engine.size, drop_last=drop_last)  # the rule's checks, here, not mid-epoch
    sampler = ShardSampler(
        data, num_replicas=engine.size, rank=engine.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    sampler.set_epoch(epoch)
    return DataLoader(data, sampler=sampler, drop_last=drop_last, **kw)
