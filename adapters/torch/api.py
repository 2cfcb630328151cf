"""Whole-job helpers with the names Horovod users know: broadcast_parameters, average_model, shard."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from fast_core import Engine
from fast_core.runtime import init as default_engine
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .optimizer import _WORKERS
from .tensors import average_tensors, broadcast_tensors, floating_tensors


def broadcast_parameters(model: torch.nn.Module, root: int = 0, engine: Engine | None = None) -> None:
    """Overwrite every rank's parameters and floating buffers with ``root``'s (collective).

    DistributedOptimizer already does this once when it wraps the model.
    """
    broadcast_tensors(floating_tensors(model), engine or default_engine(), root)


def average_model(model: torch.nn.Module, buffers: bool = True, engine: Engine | None = None) -> None:
    """Replace every rank's parameters (and floating buffers, unless ``buffers=False``) by their mean over ranks.

    Collective: the consensus model at the end of decentralized training. It closes the model's FAST worker
    first, so no message is still in flight; call it after the last step.
    """
    worker = _WORKERS.get(model)
    if worker is not None:
        worker.close()
    engine = engine or (worker.engine if worker is not None else default_engine())
    average_tensors(floating_tensors(model, buffers=buffers), engine)


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


def shard(
    data: Dataset | DataLoader, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False, engine=None, **kw
) -> DataLoader:
    """This rank's share of a dataset (or of a DataLoader's dataset), as a DataLoader with a DistributedSampler.

    Call ``loader.sampler.set_epoch(epoch)`` each epoch for a new order. ``drop_last=True`` gives every rank the
    same number of batches, which synchronous strategies need (or end with ``fast_torch.join``).
    """
    engine = engine or default_engine()
    if isinstance(data, DataLoader):
        kw.setdefault("batch_size", data.batch_size)
        kw.setdefault("num_workers", data.num_workers)
        kw.setdefault("collate_fn", data.collate_fn)
        data = data.dataset
    sampler = DistributedSampler(
        data, num_replicas=engine.size, rank=engine.rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    return DataLoader(data, sampler=sampler, drop_last=drop_last, **kw)
