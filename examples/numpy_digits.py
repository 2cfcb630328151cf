"""FAST with no deep-learning framework: softmax regression on scikit-learn's real 8x8 digits.

    mpiexec -n 4 python -m mpi4py examples/numpy_digits.py --strategy dpsgd:ring

Each rank trains on its own shard and averages parameters with its ring neighbours only (D-PSGD); rank 0 reports
the mean loss of all ranks, their consensus distance (both collectives, so asynchronous strategies report rank 0's
own loss instead, not to wait for the slowest rank), and the test accuracy of the averaged model. Under ``fast run``
the worker also records loss and samples per step and each replica's validation accuracy per epoch.

``--epochs E`` is a shared work budget of E global epochs: E times the samples of all shards together
(``fast_core.Budget``; ``fast run --budget-samples N`` or ``--budget-seconds S`` replaces it). Each rank keeps
drawing batches from its shard, reshuffled every pass, until ``worker.claim_batch`` says the job's budget is spent,
so under an asynchronous strategy a faster rank trains more of it, and under a synchronous one every rank runs the
same E passes. An "epoch" in the logs is one pass of this rank over its shard:

    fast run -n 4 --strategy async:ring --straggler 3 --budget-samples 20000 -m fast_examples.numpy_digits

At the end every rank closes its worker and the test accuracy is the averaged (consensus) model's. Under ``fast
run`` each rank also saves its parameters every ``--snapshot-every`` seconds and rank 0 records the consensus
model's validation accuracy over time (records of kind "consensus", ``fast_core.observers.snapshots``).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

import fast_core
from fast_core import Budget, run_config
from fast_core.data.datasets import batches, digits, shard_indices, train_test_split
from fast_core.data.sharding import shard_by_label
from fast_core.model.numpy_model import SGD, Momentum, SoftmaxRegression
from fast_core.observers.snapshots import FOLDER as SNAPSHOTS
from fast_core.observers.snapshots import curve_text
from fast_core.runtime import checkpoint
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve
from fast_core.runtime.summaries import epoch_summary, spent_text
from fast_core.strategies.spec import strategy_from_environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--strategy", help="e.g. allreduce, dpsgd:ring, dpsgd:exp1 (default: fast run's, else dpsgd:ring)"
    )
    parser.add_argument("--epochs", type=int, default=20, help="global epochs: the job's budget (E x the training set)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument(
        "--shards",
        choices=("iid", "label"),
        default="iid",
        help="iid: shuffled shards (default); label: split by label, each rank sees a few digits (try tracking:ring)",
    )
    parser.add_argument("--momentum", type=float, default=0.0, help="heavy-ball momentum of each rank's optimizer")
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="resume from PATH if it exists, and save the job there after every pass (a lockstep strategy: the ranks "
        "end their passes together); a requeued SLURM job resumes from it (examples/slurm/train.sbatch)",
    )
    parser.add_argument(
        "--snapshot-every", type=float, default=0.05, help="seconds between snapshots of the consensus curve (fast run)"
    )
    args = parser.parse_args()

    engine = fast_core.init()
    x, y = digits()
    x_train, y_train, x_test, y_test = train_test_split(x, y, test_fraction=0.2, seed=0)
    x_all, y_all, x_val, y_val = train_test_split(x_train, y_train, test_fraction=0.1, seed=1)

    def my_shard(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's share of the training set in a group of ``size``."""
        if args.shards == "label":
            mine = shard_by_label(y_all, rank, size)
        else:
            mine = shard_indices(len(y_all), rank, size, seed=0, drop_last=True)
        return x_all[mine], y_all[mine]

    x_train, y_train = my_shard(engine.rank, engine.size)
    global_epoch = len(y_train) // args.batch_size * args.batch_size * engine.size  # one pass of every rank

    config = run_config()
    budget = None if Budget.from_config(config) is not None else Budget(samples=args.epochs * global_epoch)
    optimizer = Momentum(args.lr, args.momentum) if args.momentum else SGD(args.lr)
    model = SoftmaxRegression(x.shape[1], 10, optimizer=optimizer, seed=engine.rank)
    strategy = args.strategy or strategy_from_environment(default="dpsgd:ring")
    worker = fast_core.Worker(model, strategy, engine, budget=budget).start()
    if args.checkpoint:
        resume_from(args.checkpoint, worker)
    snapshots = None
    if config.run_dir is not None:  # under fast run: the consensus model over time, measured after training
        snapshots = attach_snapshots(worker, config.run_dir / SNAPSHOTS, args.snapshot_every)
    if engine.rank == 0:
        print(f"{engine.size} workers, strategy {worker.strategy}, {len(y_train)} training digits each")
    steps_per_pass = len(y_train) // args.batch_size
    # where the job is in the passes over the shards: 0 at the start; a newcomer (a replacement, a worker that joined)
    # takes up the group's pass
    epoch, skip = divmod(worker.step, steps_per_pass)
    changes = len(worker.group.recoveries)
    while True:  # this rank's passes over its shard, until the job's budget is spent
        losses, spent = [], False
        shard_batches = batches(x_train, y_train, args.batch_size, epoch=epoch, seed=engine.rank)
        for xb, yb in itertools.islice(shard_batches, skip, None):
            if len(worker.group.recoveries) != changes:  # the group changed (a rank lost, workers joined): every
                break  # rank ends its pass here, at the same step
            if worker.step >= (epoch + 1) * steps_per_pass:
                break
            n = worker.claim_batch(len(yb))  # the whole batch, fewer on the budget's last grant, 0 once it is spent
            if n == 0:
                spent = True
                break
            losses.append(model.compute_gradients(xb[:n], yb[:n]))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            worker.records.step(loss=losses[-1], samples=n)  # fast run's log and progress bar
        regrouped = len(worker.group.recoveries) != changes
        if losses and not regrouped:  # (lockstep ranks stop at the same step, so they all skip an empty pass alike)
            loss, spread = epoch_summary(worker, float(np.mean(losses)))  # mean over ranks if synchronous
            worker.records.epoch(loss=loss, val_accuracy=model.accuracy(x_val, y_val))
            if engine.rank == 0 and (epoch % 5 == 4 or spent):
                spread_text = "n/a" if spread is None else f"{spread:.2e}"
                print(f"epoch {epoch + 1:3d}  loss {loss:.4f}  consensus distance {spread_text}")
        if spent:
            break
        if args.checkpoint and not regrouped:  # whole passes only: a resumed job starts at a pass's first batch
            checkpoint.save(args.checkpoint, worker)
        epoch, skip = epoch + 1, 0
        if regrouped:  # the data is cut again over the new group: this rank's share, and where the group is in it
            changes = len(worker.group.recoveries)
            x_train, y_train = my_shard(engine.rank, engine.size)
            steps_per_pass = len(y_train) // args.batch_size
            epoch, skip = divmod(worker.step, steps_per_pass)
    worker.close()  # the last messages land; then the consensus model, the average of all ranks' models
    accuracy = model.accuracy(x_test, y_test, worker.group.average_params())
    worker.records.result(test_accuracy=accuracy)
    curve = []
    if snapshots is not None:
        curve = record_consensus_curve(worker, snapshots, lambda: model.accuracy(x_val, y_val))
    metrics = worker.metrics.as_dict()
    spent = spent_text(worker, global_epoch)  # collective
    worst = np.array([model.accuracy(x_test, y_test)])  # each rank's own model, before any final average
    engine.allreduce(worst, op="min")
    if engine.rank == 0:
        print(
            f"test accuracy of the averaged model: {accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
        )
        print(f"test accuracy of the worst rank's own model: {worst[0]:.4f}")
        print(spent)
        if curve:
            print(curve_text(curve))


def resume_from(path: str, worker: fast_core.Worker) -> None:
    """Load the job's checkpoint at ``path`` if there is one (a requeued or restarted job), said by rank 0."""
    if not worker.strategy.lockstep:
        raise SystemExit(f"--checkpoint needs a lockstep strategy (allreduce, dpsgd:...), not {worker.strategy}")
    if Path(path).exists():
        saved = checkpoint.load(path, worker)
        if worker.engine.rank == 0:
            print(f"resumed from {path} at step {saved.step} ({saved.header['samples_spent']} samples trained before)")


if __name__ == "__main__":
    main()
