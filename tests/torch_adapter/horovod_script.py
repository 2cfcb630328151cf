"""A training script written for Horovod (its API, nothing of FAST's), run by tests with fast_torch.horovod.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py tests/torch_adapter/horovod_script.py OUT.npz [average|sum]

A two-layer network on scikit-learn's digits, a DistributedSampler per rank, SGD with momentum and weight decay,
rank 0's start broadcast with ``broadcast_parameters``/``broadcast_optimizer_state``, the averaged gradients
clipped between ``synchronize()`` and ``step()`` as Horovod's documentation shows, the loss averaged with
``hvd.allreduce``. Rank 0 writes the final parameters and the averaged losses to OUT.npz;
tests/torch_adapter/test_horovod.py checks them against Horovod's rule computed in one process.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import fast_torch.horovod as hvd  # the one line that differs from a Horovod script

BATCH, STEPS, LR, MOMENTUM, DECAY, CLIP = 16, 12, 0.05, 0.9, 1e-3, 1.0


def build() -> tuple[torch.nn.Module, TensorDataset]:
    digits = load_digits()
    data = TensorDataset(
        torch.tensor(digits.data[:400] / 16.0, dtype=torch.float32), torch.tensor(digits.target[:400])
    )
    torch.manual_seed(1234 + hvd.rank())  # every rank starts elsewhere: broadcast_parameters must fix it
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    return model, data


def main(out: str, op_name: str) -> None:
    hvd.init()
    torch.set_num_threads(1)
    model, data = build()
    sampler = DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * (hvd.rank() + 1), momentum=MOMENTUM, weight_decay=DECAY)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)  # rank 0's lr on every rank
    op = hvd.Sum if op_name == "sum" else hvd.Average
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=op)
    losses = []
    for x, y in loader:
        if len(losses) == STEPS:
            break
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        with optimizer.skip_synchronize():
            optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    if hvd.rank() == 0:
        arrays = {name: p.detach().numpy() for name, p in model.named_parameters()}
        np.savez(out, losses=np.array(losses), **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "average")
