"""Horovod's PyTorch elastic example in shape (examples/elastic/pytorch/pytorch_mnist_elastic.py: ``TorchState(model,
optimizer, epoch=, batch=)``, a reset callback that scales the learning rate by ``hvd.size()``, ``@hvd.elastic.run``,
``state.commit()`` every few batches) on the digits, with FAST's import only:

    fast run [--fault-tolerant [--max-restarts K]] -n 2 tests/torch_adapter/horovod_elastic_script.py

Each rank prints one JSON line: its rank, the epochs trained, the test accuracy averaged over ranks, and the sum of
its parameters.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F  # noqa: N812 - Horovod's examples' name
from torch.utils.data.distributed import DistributedSampler

import fast_torch.horovod as hvd  # instead of: import horovod.torch as hvd
from fast_core.data.datasets import example_task

EPOCHS, BATCH, LR, BATCHES_PER_COMMIT = 4, 32, 0.05, 4

hvd.init()
task = example_task("digits")  # 8x8 digit images as float32 rows, in NumPy
(x_train, y_train), (x_test, y_test) = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in (task.train, task.test)]

torch.manual_seed(hvd.rank())  # rank 0's start reaches every rank at the first sync
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 - Horovod's own loop
        sampler = DistributedSampler(range(len(y_train)), num_replicas=hvd.size(), rank=hvd.rank(), seed=7)
        sampler.set_epoch(state.epoch)
        indices = list(sampler)
        batches = [indices[i : i + BATCH] for i in range(0, len(indices), BATCH)]
        for batch in range(state.batch, len(batches)):
            state.optimizer.zero_grad()
            loss = F.cross_entropy(state.model(x_train[batches[batch]]), y_train[batches[batch]])
            loss.backward()
            state.optimizer.step()
            state.batch = batch + 1
            if state.batch % BATCHES_PER_COMMIT == 0:
                state.commit()
        state.batch = 0
        state.commit()


def on_state_reset() -> None:
    for group in optimizer.param_groups:  # Horovod: scale the learning rate by the new number of ranks
        group["lr"] = LR * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)

with torch.no_grad():
    accuracy = (model(x_test).argmax(1) == y_test).float().mean()
accuracy = hvd.allreduce(accuracy, name="accuracy").item()
total = sum(p.detach().double().sum().item() for p in model.parameters())
print(json.dumps({"rank": hvd.rank(), "epochs": state.epoch + 1, "accuracy": accuracy, "params": total}), flush=True)
