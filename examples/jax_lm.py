"""FAST with JAX and Flax: the GPT-2-style byte-level language model of torch_lm, on the standard library's source.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py examples/jax_lm.py --size tiny --strategy dpsgd:ring
    fast run -n 2 --strategy diloco:period=20 -m fast_examples.jax_lm --size tiny --epochs 4

The twin of ``fast_examples.torch_lm`` (same corpus, split, sizes, budget and report; its docstring says how): the
model is ``fast_examples.flax_gpt`` and the optimizer optax's AdamW. As in jax_digits, ``fast.distributed`` wraps
the jitted ``train_step(params, opt_state, batch)`` for strategies that exchange parameters, and ``grad_step(params,
batch)`` (the optimizer applied by FAST) for those that exchange gradients (all-reduce, FAST). At the end rank 0
prints and records the consensus model's validation loss, perplexity and next-byte accuracy.
"""

from __future__ import annotations

import itertools
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fast_jax as fast
from fast_core import Budget, Strategy, make_strategy, run_config
from fast_core.observers.snapshots import FOLDER as SNAPSHOTS
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve
from fast_core.runtime.summaries import epoch_summary, spent_text
from fast_examples import lm_run
from fast_examples.flax_gpt import GPT, init_params, lm_loss
from fast_examples.lm_data import Size, shard_tokens, validation_windows
from fast_examples.lm_data import windows as sample_windows


@lru_cache(maxsize=8)
def make_steps(size: Size, lr: float) -> tuple[optax.GradientTransformation, object, object, object]:
    """AdamW and the jitted step forms and evaluation, cached so repeated runs compile once."""
    optimizer = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1)
    loss_fn = partial(lm_loss, size)

    @jax.jit
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def grad_step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        return grads, loss

    @jax.jit
    def scores(params, inputs, targets):
        logits = GPT(size).apply({"params": params}, inputs).astype(jnp.float32)
        total = optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum()
        return total, jnp.sum(jnp.argmax(logits, -1) == targets)

    return optimizer, train_step, grad_step, scores


def evaluate(scores, params, data: tuple[np.ndarray, np.ndarray], batch: int) -> tuple[float, float]:
    """(mean loss in nats per byte, next-byte accuracy) on the held-out windows."""
    total, correct = 0.0, 0
    for start in range(0, len(data[0]), batch):
        loss, right = scores(params, data[0][start : start + batch], data[1][start : start + batch])
        total, correct = total + float(loss), correct + int(right)
    return total / data[1].size, correct / data[1].size


def train(
    strategy: str | Strategy = "dpsgd:ring",
    size: str = "tiny",
    epochs: int = 3,
    steps_per_epoch: int | None = None,
    batch_size: int | None = None,
    seq: int | None = None,
    lr: float | None = None,
    seed: int = 0,
    corpus: str | None = None,
    max_corpus_bytes: int | None = None,
    val_windows: int = 64,
    snapshot_every: float = 0.5,
    verbose: bool = True,
) -> dict[str, float]:
    """Train the LM with ``strategy`` on every rank (collective); returns the consensus model's
    ``{"val_loss", "perplexity", "val_accuracy"}``."""
    run = lm_run.plan(size, seq, batch_size, steps_per_epoch, lr, corpus, max_corpus_bytes)  # may refuse
    seq, batch_size, steps_per_epoch, lr, text = run.seq, run.batch, run.steps_per_epoch, run.lr, run.text
    engine = fast.init()
    own = shard_tokens(text.train, engine.rank, engine.size)
    held_out = validation_windows(text, seq, val_windows, seed)
    rng = np.random.default_rng([seed, engine.rank])
    global_epoch = steps_per_epoch * batch_size * engine.size
    config = run_config()
    budget = None if Budget.from_config(config) is not None else Budget(samples=epochs * global_epoch)
    optimizer, train_step, grad_step, scores = make_steps(run.size, lr)
    strategy = make_strategy(strategy)
    if strategy.uses_gradients:
        step = fast.distributed(grad_step, strategy, optimizer=optimizer, budget=budget)
    else:
        step = fast.distributed(train_step, strategy, budget=budget)
    params = init_params(run.size, seed)
    params, opt_state = step.start(params, optimizer.init(params))  # collective: rank 0's start everywhere
    worker = step.worker
    snapshots = attach_snapshots(worker, config.run_dir / SNAPSHOTS, snapshot_every) if config.run_dir else None
    restarts = worker.claims.collective_passes(global_epoch, batch_size)
    if verbose and engine.rank == 0:
        print(run.header(engine.size, strategy, epochs, "float32", budget is None))
    for epoch in itertools.count():
        losses, spent = [], False
        for _ in range(steps_per_epoch):
            n = worker.claim_batch(batch_size)
            if n == 0:
                spent = True
                break
            x, y = (a[:n] for a in sample_windows(own, seq, batch_size, rng))
            params, opt_state, loss = step(params, opt_state, (x, y))
            losses.append(loss)
            if worker.records.wanted:  # under `fast run`: float() waits for the step, so only then
                worker.records.step(loss=float(loss), samples=n)
        if losses:
            mean_loss, spread = epoch_summary(worker, float(jnp.mean(jnp.stack(losses))))
            val_loss, val_accuracy = evaluate(scores, params, held_out, batch_size)
            worker.records.epoch(loss=mean_loss, val_accuracy=val_accuracy, val_loss=val_loss)
            if restarts is None or epoch < restarts:
                params, opt_state = step.end_epoch(params, opt_state, val_accuracy)
            if verbose and engine.rank == 0:
                print(lm_run.epoch_line(epoch, mean_loss, val_loss, spread))
        if spent:
            break
    params = fast.average(params, step=step)  # closes the step's worker first, then averages
    metrics = worker.metrics.as_dict()
    val_loss, val_accuracy = evaluate(scores, params, held_out, batch_size)
    result = lm_run.result_of(val_loss, val_accuracy)
    worker.records.result(test_accuracy=val_accuracy, val_loss=val_loss, perplexity=result["perplexity"])
    if snapshots is not None:

        def score(index: int) -> float:
            return evaluate(scores, step.model.params_tree(), held_out, batch_size)[index]

        record_consensus_curve(worker, snapshots, lambda: score(0), "val_loss", True)
        record_consensus_curve(worker, snapshots, lambda: score(1))
    spent = spent_text(worker, global_epoch)  # collective
    if verbose and engine.rank == 0:
        print(lm_run.result_line(result, metrics))
        print(spent)
    return result


def main(argv: list[str] | None = None) -> None:
    lm_run.run("jax_lm", train, lm_run.parser(__doc__.split("\n")[0]).parse_args(argv))


if __name__ == "__main__":
    main()
