"""FAST with Keras 3: a small CNN on scikit-learn's real 8x8 digits (or MNIST-1D), on 4 MPI ranks, any backend.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py examples/keras_digits.py --strategy async:torus [--data mnist1d]

``KERAS_BACKEND=jax`` (or ``torch``) in front runs the same script on another Keras backend. Each rank fits on its
own shard (``fast.shard``); ``fast.Callback`` runs the strategy inside ``model.fit``; gradient strategies
(all-reduce, FAST) compile with ``fast.DistributedOptimizer``. ``--epochs E`` is a shared work budget of E global
epochs, E times the samples of all shards together (``fast_core.Budget``), as in the torch example: ``fit`` reads
the shard through ``fast.Batches`` (full batches, reshuffled at each pass, endlessly) and the callback claims
every batch, so under a synchronous strategy every rank runs the same E passes, and under an asynchronous one a
faster rank trains more of the budget and every rank's fit stops once it is spent. ``fast run --budget-samples N``
or ``--budget-seconds S`` replaces ``--epochs``. A Keras epoch is one pass of this rank over its shard; the
callback averages the logged metrics over ranks (rank 0's progress lines then show the job's loss and the
consensus distance) only where every rank takes part: every epoch under a synchronous strategy, never under an
asynchronous one, whose FAST restarts run only after the passes every rank is sure to finish. At the end every
rank holds the averaged model; rank 0 prints its test accuracy and how the job spent its budget.

The pieces are importable (``load``, ``build``, ``train``) so tests reuse them.
"""

from __future__ import annotations

import argparse
import gc
import math

import keras
import numpy as np

import fast_tf as fast
from fast_core import Budget, Strategy, make_strategy, run_config
from fast_core.data.datasets import TASKS, Task, example_task
from fast_core.runtime.summaries import spent_text
from fast_core.strategies.spec import strategy_from_environment

Split = tuple[np.ndarray, np.ndarray]


def load(name: str = "digits", seed: int = 0) -> tuple[Task, Split, Split, Split]:
    """The task and its (train, validation, test) splits with a channel axis last, the same on every rank."""
    task = example_task(name, seed)

    def arrays(split: tuple[np.ndarray, np.ndarray]) -> Split:
        images, labels = split
        return images.reshape(-1, *task.sample_shape, 1), labels

    return task, arrays(task.train), arrays(task.validation), arrays(task.test)


def build(task: Task, strategy: Strategy, lr: float = 0.05, seed: int = 0) -> keras.Model:
    """A small CNN (2-D for the digits, about 10k parameters; 1-D for MNIST-1D), compiled with SGD + momentum.

    A gradient strategy gets the optimizer wrapped in ``fast.DistributedOptimizer``; the others keep it plain, so
    the update stays inside the compiled train step.
    """
    keras.utils.set_random_seed(seed)
    if len(task.sample_shape) == 1:
        conv, pool = keras.layers.Conv1D, keras.layers.MaxPooling1D
        body = [conv(32, 5, padding="same", activation="relu"), conv(32, 3, padding="same", activation="relu"), pool(2)]
        body += [conv(32, 3, padding="same", activation="relu"), pool(2)]
    else:
        conv = keras.layers.Conv2D
        body = [conv(16, 3, padding="same", activation="relu"), conv(32, 3, padding="same", activation="relu")]
        body += [keras.layers.MaxPooling2D(2)]
    model = keras.Sequential(
        [keras.Input((*task.sample_shape, 1)), *body, keras.layers.Flatten(), keras.layers.Dense(task.classes)]
    )
    optimizer = keras.optimizers.SGD(lr, momentum=0.9)
    if strategy.uses_gradients:
        optimizer = fast.DistributedOptimizer(optimizer)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train(
    strategy: str | Strategy = "dpsgd:ring",
    data: str = "digits",
    epochs: int = 10,
    batch_size: int = 16,
    lr: float = 0.05,
    seed: int = 0,
    verbose: bool = True,
) -> float:
    """Train one model with ``strategy`` on every rank (collective); returns the averaged model's test accuracy.

    ``epochs``: global epochs, the job's shared budget (ignored when ``fast run`` gives one)."""
    engine = fast.init()
    strategy = make_strategy(strategy)
    task, (x, y), validation, (x_test, y_test) = load(data, seed)
    x, y = fast.shard(x, y, seed=seed)  # equal shards: a synchronous strategy runs the same steps everywhere
    batches = fast.Batches(x, y, batch_size=batch_size, seed=seed)
    global_epoch = batches.steps * batch_size * engine.size  # the samples of one pass of every rank over its shard
    budget = Budget.from_config(run_config()) or Budget(samples=epochs * global_epoch)
    model = build(task, strategy, lr, seed)
    talk = verbose and engine.rank == 0
    if talk:
        print(
            f"{engine.size} workers on Keras' {keras.backend.backend()} backend, strategy {strategy}, {task.name}: "
            f"{len(y)} training samples each, {len(validation[1])} for validation, "
            f"{len(y_test)} for testing; budget {_budget_text(budget, global_epoch)}",
            flush=True,
        )
    # claims every batch of the budget; averages the logs over ranks and FAST restarts from the best val_accuracy
    # where every rank takes part; batch_size: the samples of each claim (and `fast run`'s samples/s)
    callback = fast.Callback(strategy, batch_size=batch_size, budget=budget)
    model.fit(
        batches,
        steps_per_epoch=batches.steps,
        epochs=_passes(budget, strategy, batches.steps * batch_size, engine.size),
        shuffle=False,  # fast.Batches reshuffles each pass itself
        validation_data=validation,
        callbacks=[callback],
        verbose=2 if talk else 0,
    )
    gc.collect()  # TensorFlow finalizes the feed's generator now rather than at exit, where it would print an error
    accuracy = float(model.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"])
    worker = callback.worker
    worker.records.result(test_accuracy=accuracy)  # `fast run`'s records; free otherwise
    spent = spent_text(worker, global_epoch)  # collective
    if talk:
        metrics = worker.metrics.as_dict()
        print(
            f"test accuracy of the averaged model: {accuracy:.4f}  "
            f"({metrics['steps']} steps, {metrics['bytes_sent'] / 1e6:.2f} MB sent by rank 0)",
            flush=True,
        )
        print(spent, flush=True)
    return accuracy


def _passes(budget: Budget, strategy: Strategy, pass_samples: int, size: int) -> int:
    """The most passes over its shard (Keras epochs) this rank may train before the budget is spent: fit's
    ``epochs``, so the progress lines count to the right number. Synchronous: every rank runs the job's steps;
    asynchronous: one rank may train the whole budget; seconds only: no bound."""
    if budget.samples is None:
        return 1_000_000
    return math.ceil(budget.samples / (pass_samples * size if strategy.lockstep else pass_samples))


def _budget_text(budget: Budget, global_epoch: int) -> str:
    parts = [f"{budget.samples} samples ({budget.samples / global_epoch:g} global epochs)"] if budget.samples else []
    parts += [f"{budget.seconds:g} s"] if budget.seconds is not None else []
    return " or ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--strategy", help="e.g. allreduce, dpsgd:ring, async:torus, fast:torus (default: fast run's, else dpsgd:ring)"
    )
    parser.add_argument("--data", choices=TASKS, default="digits", help="the task (both made locally, no download)")
    parser.add_argument(
        "--epochs", type=int, default=10, help="global epochs: the job's budget, E times the whole training set"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    args = parser.parse_args()
    train(
        args.strategy or strategy_from_environment(default="dpsgd:ring"),
        args.data,
        args.epochs,
        args.batch_size,
        args.lr,
    )


if __name__ == "__main__":
    main()
