"""FAST with JAX: an MLP in jax.numpy on scikit-learn's real 8x8 digits (or MNIST-1D), optax SGD, 4 MPI ranks.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py examples/jax_digits.py --strategy dpsgd:ring [--data mnist1d]

Each rank trains on its own shard (``fast.shard``). ``fast.distributed`` wraps the jitted step: for strategies
that exchange parameters it wraps ``train_step(params, opt_state, batch)`` as is; for those that exchange
gradients (all-reduce, FAST) it wraps ``grad_step(params, batch)`` and applies the gradient through the optax
optimizer itself.

``--epochs E`` is a shared work budget of E global epochs: E times the samples of all shards together
(``fast_core.Budget``; ``fast run --budget-samples N`` or ``--budget-seconds S`` replaces it). Every rank claims
each batch (``step.worker.claim_batch``) and keeps drawing batches from its shard, reshuffled at each pass, until
the job's budget is spent: a faster rank trains more of it under an asynchronous strategy, every rank runs the same
E passes under a synchronous one. An "epoch" in the logs is one pass of this rank over its shard: the rank scores
its replica on the same held-out validation set, and rank 0 reports the mean loss of all ranks and their consensus
distance (both collectives, so only under synchronous strategies; asynchronous ones report rank 0's own loss, not to
wait for the slowest rank). FAST's restart from the best replica (``step.end_epoch``, a collective) runs after every
pass under a synchronous strategy, and under an asynchronous one only after the passes every rank is sure to finish
(``Claims.collective_passes``: the first E - 1 of E global epochs), where the faster ranks wait as in the paper. At
the end, the test accuracy of the averaged (consensus) model. Under ``fast run`` the worker also records loss and
samples per step and each replica's validation accuracy per epoch, each rank saves its parameters every
``--snapshot-every`` seconds, and rank 0 records the consensus model's validation accuracy over time (records of
kind "consensus", ``fast_core.observers.snapshots``).

The pieces are importable (``load_data``, ``build_model``, ``accuracy``, ``train``) so tests reuse them.
"""

from __future__ import annotations

import argparse
import itertools
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fast_jax as fast
from fast_core import Budget, Strategy, make_strategy, run_config
from fast_core.data.datasets import TASKS, Task, batches, example_task
from fast_core.observers.snapshots import FOLDER as SNAPSHOTS
from fast_core.observers.snapshots import curve_text
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve
from fast_core.runtime.summaries import epoch_summary, spent_text
from fast_core.strategies.spec import strategy_from_environment

Params = dict[str, dict[str, jax.Array]]
HIDDEN = 128


def load_data(name: str = "digits", seed: int = 0) -> Task:
    """The task, split the same way on every rank: float32 (N, features) inputs and int labels."""
    return example_task(name, seed)


def build_model(task: Task, seed: int = 0, hidden: int = HIDDEN) -> Params:
    """A two-layer MLP's parameters (He initialisation): 64 inputs for the digits, 40 for MNIST-1D."""
    features = int(np.prod(task.sample_shape))
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "hidden": {
            "w": jax.random.normal(k1, (features, hidden)) * jnp.sqrt(2.0 / features),
            "b": jnp.zeros(hidden),
        },
        "out": {
            "w": jax.random.normal(k2, (hidden, task.classes)) * jnp.sqrt(2.0 / hidden),
            "b": jnp.zeros(task.classes),
        },
    }


def predict(params: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def loss_fn(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return optax.softmax_cross_entropy_with_integer_labels(predict(params, x), y).mean()


@jax.jit
def _correct(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum(jnp.argmax(predict(params, x), axis=1) == y)


def accuracy(params: Params, split: tuple[np.ndarray, np.ndarray]) -> float:
    x, y = split
    return int(_correct(params, x, y)) / len(y)


@lru_cache(maxsize=8)
def make_steps(lr: float) -> tuple[optax.GradientTransformation, object, object]:
    """The optimizer (SGD, momentum 0.9) and the two jitted step forms; cached so repeated runs compile once."""
    optimizer = optax.sgd(lr, momentum=0.9)

    @jax.jit
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def grad_step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return grads, loss

    return optimizer, train_step, grad_step


def train(
    strategy: str | Strategy = "dpsgd:ring",
    data: str = "digits",
    epochs: int = 15,
    batch_size: int = 16,
    lr: float = 0.05,
    seed: int = 0,
    verbose: bool = True,
    snapshot_every: float = 0.1,
) -> float:
    """Train one model with ``strategy`` on every rank (collective); returns the averaged model's test accuracy.

    ``epochs``: global epochs, the job's shared budget (ignored when ``fast run`` gives one). ``snapshot_every``:
    seconds between the parameter snapshots of the consensus curve (under ``fast run`` only)."""
    engine = fast.init()
    task = load_data(data, seed)
    x, y = fast.shard(*task.train, seed=seed, drop_last=True)
    global_epoch = len(y) // batch_size * batch_size * engine.size  # the samples one pass of every rank trains
    config = run_config()
    budget = None if Budget.from_config(config) is not None else Budget(samples=epochs * global_epoch)
    optimizer, train_step, grad_step = make_steps(lr)
    strategy = make_strategy(strategy)
    if strategy.uses_gradients:  # all-reduce averages gradients, FAST applies its neighbours' with the optimizer
        step = fast.distributed(grad_step, strategy, optimizer=optimizer, budget=budget)
    else:
        step = fast.distributed(train_step, strategy, budget=budget)
    params = build_model(task, seed)
    params, opt_state = step.start(params, optimizer.init(params))  # collective: rank 0's start everywhere
    worker = step.worker
    snapshots = None
    if config.run_dir is not None:  # under fast run: the consensus model over time, measured after training
        snapshots = attach_snapshots(worker, config.run_dir / SNAPSHOTS, snapshot_every)
    restarts = worker.claims.collective_passes(global_epoch, batch_size)  # FAST's restarts: where every rank takes part
    if verbose and engine.rank == 0:
        print(
            f"{engine.size} workers, strategy {strategy}, {task.name}: {len(y) // batch_size * batch_size} training "
            f"samples each, {len(task.validation[1])} for validation, {len(task.test[1])} for testing"
        )
    for epoch in itertools.count():  # this rank's passes over its shard, until the job's budget is spent
        losses, spent = [], False
        for batch in batches(x, y, batch_size, epoch, seed):
            n = worker.claim_batch(len(batch[1]))  # the whole batch, fewer on the job's last grant, 0 once spent
            if n == 0:
                spent = True
                break
            if n < len(batch[1]):
                batch = (batch[0][:n], batch[1][:n])
            params, opt_state, loss = step(params, opt_state, batch)
            losses.append(loss)
            if worker.records.wanted:  # under `fast run`: float() waits for the step, so only then
                worker.records.step(loss=float(loss), samples=n)
        if losses:  # lockstep ranks stop at the same step, so they all skip an empty last pass alike
            # mean over ranks and consensus distance if synchronous, before FAST's restart makes the distance 0
            mean_loss, spread = epoch_summary(worker, float(jnp.mean(jnp.stack(losses))))
            val_accuracy = accuracy(params, task.validation)
            worker.records.epoch(loss=mean_loss, val_accuracy=val_accuracy)
            if restarts is None or epoch < restarts:
                params, opt_state = step.end_epoch(params, opt_state, val_accuracy)
            if verbose and engine.rank == 0:
                spread_text = "n/a" if spread is None else f"{spread:.2e}"
                print(f"epoch {epoch + 1:3d}  loss {mean_loss:.4f}  consensus distance {spread_text}")
        if spent:
            break
    params = fast.average(params, step=step)  # closes the step's worker first (its last messages land), then averages
    metrics = worker.metrics.as_dict()
    test_accuracy = accuracy(params, task.test)
    worker.records.result(test_accuracy=test_accuracy)
    curve = []
    if snapshots is not None:
        curve = record_consensus_curve(worker, snapshots, lambda: accuracy(step.model.params_tree(), task.validation))
    spent = spent_text(worker, global_epoch)  # collective
    if verbose and engine.rank == 0:
        print(
            f"test accuracy of the averaged model: {test_accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)"
        )
        print(spent)
        if curve:
            print(curve_text(curve))
    return test_accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--strategy", help="e.g. allreduce, dpsgd:ring, async:torus, fast:torus (default: fast run's, else dpsgd:ring)"
    )
    parser.add_argument("--data", choices=TASKS, default="digits", help="the task (both made locally, no download)")
    parser.add_argument(
        "--epochs", type=int, default=15, help="global epochs: the job's budget, E times the whole training set"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument(
        "--snapshot-every", type=float, default=0.1, help="seconds between snapshots of the consensus curve (fast run)"
    )
    args = parser.parse_args()
    train(
        args.strategy or strategy_from_environment(default="dpsgd:ring"),
        args.data,
        args.epochs,
        args.batch_size,
        args.lr,
        snapshot_every=args.snapshot_every,
    )


if __name__ == "__main__":
    main()
