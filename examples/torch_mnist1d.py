"""FAST with PyTorch: a small CNN on MNIST-1D (made locally) or scikit-learn's real 8x8 digits, on 4 MPI ranks.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py examples/torch_mnist1d.py --strategy dpsgd:ring [--data digits]

Each rank trains on its own shard (``fast.shard``); ``fast.DistributedOptimizer`` runs the strategy around the
optimizer's own step. ``--epochs E`` is a shared work budget of E global epochs: E passes of the whole job over
the training set, i.e. E times the samples of all shards together (``fast_core.Budget``). Every rank claims each
batch (``worker.claim_batch``) and keeps drawing batches from its shard, reshuffled at each pass, until the job's
budget is spent: under a synchronous strategy every rank runs the same E passes; under an asynchronous one a
faster rank simply trains more of the budget, and all stop together. ``fast run --budget-samples N`` or
``--budget-seconds S`` replaces ``--epochs``.

An "epoch" in the logs is one pass of this rank over its shard: at its end the rank scores its replica on the
held-out validation set. The per-epoch collectives (the loss averaged over ranks, the consensus distance, and
FAST's restart from the best replica through ``worker.end_epoch``) run only where every rank takes part equally:
after every pass under a synchronous strategy (all ranks run the same steps); under an asynchronous one the loss is
this rank's own and ``end_epoch`` runs only after the passes every rank is sure to finish before the budget is
spent (the first E - 1 of E global epochs, none under a seconds budget). So FAST as published (``fast:torus``)
restarts from the best replica after each of those passes, where the faster ranks wait for the slowest as in the
paper; the other asynchronous strategies do nothing there and never wait. At the end every rank closes its worker
(the last messages land) and takes the average of all ranks' models: the consensus model, whose test accuracy is
reported and which a user would save.

Under ``fast run`` the worker also records loss and samples per step and each replica's validation accuracy per
epoch, and each rank saves its parameters every ``--snapshot-every`` seconds (``fast_core.observers.snapshots``); after
training rank 0 averages the snapshots of each moment and records the consensus model's validation accuracy over
time (records of kind "consensus": ``time`` since the common start, ``val_accuracy``), which ``fast bench`` times
to its target, without any rank waiting for another during training. ``--ddp`` trains with torch's
DistributedDataParallel instead, the baseline of ``fast bench --compare-ddp``.

The pieces are importable (``load_data``, ``build_model``, ``accuracy``, ``train``) so tests reuse them.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import fast_torch as fast
from fast_core import Budget, Strategy, run_config
from fast_core.data.datasets import TASKS, Task, example_task
from fast_core.observers.snapshots import FOLDER as SNAPSHOTS
from fast_core.observers.snapshots import curve_text
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve
from fast_core.runtime.summaries import epoch_summary, spent_text
from fast_core.strategies.spec import strategy_from_environment

Split = tuple[torch.Tensor, torch.Tensor]


def load_data(name: str = "mnist1d", seed: int = 0) -> tuple[Task, Split, Split, Split]:
    """The task and its (train, validation, test) splits as tensors with a channel axis, the same on every rank."""
    task = example_task(name, seed)

    def tensors(split: tuple[np.ndarray, np.ndarray]) -> Split:
        images, labels = split
        return torch.from_numpy(images.reshape(-1, 1, *task.sample_shape)), torch.from_numpy(labels)

    return task, tensors(task.train), tensors(task.validation), tensors(task.test)


def build_model(task: Task, seed: int = 0, hidden: int = 0) -> torch.nn.Module:
    """A small CNN: 1-D for MNIST-1D (about 9k float32 parameters), 2-D for the 8x8 digits (about 10k).

    ``hidden`` > 0 puts a dense layer of that many units before MNIST-1D's classifier: a model of many more bytes
    for little more compute (1024: 0.33M parameters, 1.3 MB), for links that are the bottleneck."""
    torch.manual_seed(seed)
    if len(task.sample_shape) == 1:
        length = task.sample_shape[0]
        head = [torch.nn.Linear(32 * (length // 4), task.classes)]
        if hidden:
            head = [torch.nn.Linear(32 * (length // 4), hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, task.classes)]
        return torch.nn.Sequential(
            torch.nn.Conv1d(1, 32, 5, padding=2),
            torch.nn.ReLU(),
            torch.nn.Conv1d(32, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool1d(2),
            torch.nn.Conv1d(32, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool1d(2),
            torch.nn.Flatten(),
            *head,
        )
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, task.classes),
    )


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: Split) -> float:
    images, labels = data
    first = next(model.parameters())
    model.eval()
    correct = (model(images.to(first.device, first.dtype)).argmax(dim=1).cpu() == labels).sum().item()
    model.train()
    return correct / len(labels)


def train(
    strategy: str | Strategy = "dpsgd:ring",
    data: str = "mnist1d",
    epochs: int = 10,
    batch_size: int = 16,
    lr: float = 0.05,
    seed: int = 0,
    verbose: bool = True,
    ddp: bool = False,
    snapshot_every: float = 0.2,
    device: str = "cpu",
    dtype: str = "float32",
    hidden: int = 0,
) -> float:
    """Train one model with ``strategy`` on every rank (collective); returns the averaged model's test accuracy.

    ``epochs``: global epochs, the job's shared budget (ignored when ``fast run`` gives one). ``ddp``:
    DistributedDataParallel averages the gradients instead, FAST's worker only counts steps and reports.
    ``snapshot_every``: seconds between the parameter snapshots of the consensus curve (under ``fast run`` only).
    ``device``/``dtype``: where and in what precision the model trains (e.g. "cuda", "bfloat16"). ``hidden``: see
    ``build_model``."""
    engine = fast.init()
    task, train_set, val_set, test_set = load_data(data, seed)
    loader = fast.shard(TensorDataset(*train_set), batch_size=batch_size, drop_last=True, seed=seed)
    global_epoch = len(loader) * batch_size * engine.size  # the samples one pass of every rank over its shard trains
    config = run_config()
    budget = None if Budget.from_config(config) is not None else Budget(samples=epochs * global_epoch)
    model = build_model(task, seed, hidden).to(device=device, dtype=getattr(torch, dtype))
    if ddp:  # gloo on the MPI job's ranks; MASTER_ADDR and MASTER_PORT come from the environment (fast run sets them)
        dist.init_process_group("gloo", rank=engine.rank, world_size=engine.size)
        strategy = Strategy()  # the base Strategy exchanges nothing (and is lockstep: every rank runs the same steps)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = fast.DistributedOptimizer(optimizer, model, strategy=strategy, budget=budget)
    worker = opt.fast_worker
    snapshots = None
    if config.run_dir is not None:  # under fast run: the consensus model over time, measured after training
        snapshots = attach_snapshots(worker, config.run_dir / SNAPSHOTS, snapshot_every)
    worker.start()  # collective; a process replacing a lost rank (fast run --max-restarts) joins the job here
    # where the job is in the passes over the shards: 0 at the start; a newcomer (a replacement, a worker that joined)
    # takes up the group's pass
    epoch, skip = divmod(worker.step, len(loader))
    changes = len(worker.group.recoveries)
    step_model = DistributedDataParallel(model) if ddp else model  # DDP averages gradients during backward
    restarts = worker.claims.collective_passes(global_epoch, batch_size)  # FAST's restarts: where every rank takes part
    if verbose and engine.rank == 0:
        print(
            f"{engine.size} workers, strategy {'DDP (gloo)' if ddp else worker.strategy}, {task.name}: "
            f"{len(loader) * batch_size} training samples each, {len(val_set[1])} for validation, "
            f"{len(test_set[1])} for testing; budget {_budget_text(worker.claims.budget, global_epoch)}"
        )
    while True:  # this rank's passes over its shard, until the budget is spent
        loader.sampler.set_epoch(epoch)
        total, batches, spent = 0.0, 0, False
        for images, labels in itertools.islice(loader, skip, None):
            if len(worker.group.recoveries) != changes:  # the group changed (a rank lost, workers joined): every
                break  # rank ends its pass here, at the same step
            if worker.step >= (epoch + 1) * len(loader):
                break
            n = worker.claim_batch(len(labels))  # the whole batch, fewer on the job's last grant, 0 once spent
            if n == 0:
                spent = True
                break
            opt.zero_grad()
            images, labels = images[:n].to(device, getattr(torch, dtype)), labels[:n].to(device)
            loss = torch.nn.functional.cross_entropy(step_model(images).float(), labels)
            loss.backward()
            opt.step()
            total += loss.item()
            batches += 1
            worker.records.step(loss=loss.item(), samples=n)  # fast run's log and progress bar
        regrouped = len(worker.group.recoveries) != changes
        if batches and not regrouped:  # lockstep ranks stop at the same step, so they all skip an empty pass alike
            mean_loss, spread = epoch_summary(worker, total / batches)  # collective only if lockstep
            val_accuracy = accuracy(model, val_set)
            worker.records.epoch(loss=mean_loss, val_accuracy=val_accuracy)
            if restarts is None or epoch < restarts:
                worker.end_epoch(val_accuracy)  # FAST: every rank restarts from the best replica
            if verbose and engine.rank == 0:
                spread_text = "n/a" if spread is None else f"{spread:.2e}"
                print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}  consensus distance {spread_text}")
        if spent:
            break
        epoch, skip = epoch + 1, 0
        if regrouped:  # the data is cut again over the new group: this rank's share, and where the group is in it
            changes = len(worker.group.recoveries)
            loader = fast.shard(TensorDataset(*train_set), batch_size=batch_size, drop_last=True, seed=seed)
            epoch, skip = divmod(worker.step, len(loader))
    fast.average_model(model)  # closes the worker first (its last messages land), then the consensus model
    test_accuracy = accuracy(model, test_set)
    worker.records.result(test_accuracy=test_accuracy)
    curve = record_consensus_curve(worker, snapshots, lambda: accuracy(model, val_set)) if snapshots else []
    if ddp:
        dist.destroy_process_group()
    spent = spent_text(worker, global_epoch)  # collective
    if verbose and engine.rank == 0:
        metrics = worker.metrics.as_dict()
        print(
            f"test accuracy of the averaged model: {test_accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
        )
        print(spent)
        if curve:
            print(curve_text(curve))
    return test_accuracy


def _budget_text(budget: Budget | None, global_epoch: int) -> str:
    if budget is None:
        return "none"
    parts = [f"{budget.samples} samples ({budget.samples / global_epoch:g} global epochs)"] if budget.samples else []
    parts += [f"{budget.seconds:g} s"] if budget.seconds is not None else []
    return " or ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--strategy", help="e.g. allreduce, dpsgd:ring, async:torus, fast:torus (default: fast run's, else dpsgd:ring)"
    )
    parser.add_argument("--data", choices=TASKS, default="mnist1d", help="the task (both made locally, no download)")
    parser.add_argument(
        "--epochs", type=int, default=10, help="global epochs: the job's budget, E times the whole training set"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--ddp", action="store_true", help="train with DistributedDataParallel (gloo) instead")
    parser.add_argument("--device", default="cpu", help="where the model trains, e.g. cuda or cuda:0 (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    parser.add_argument("--hidden", type=int, default=0, help="units of a dense layer before the classifier (MNIST-1D)")
    parser.add_argument(
        "--snapshot-every", type=float, default=0.2, help="seconds between snapshots of the consensus curve (fast run)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(
        args.strategy or strategy_from_environment(default="dpsgd:ring"),
        args.data,
        args.epochs,
        args.batch_size,
        args.lr,
        ddp=args.ddp,
        snapshot_every=args.snapshot_every,
        device=args.device,
        dtype=args.dtype,
        hidden=args.hidden,
    )


if __name__ == "__main__":
    main()
