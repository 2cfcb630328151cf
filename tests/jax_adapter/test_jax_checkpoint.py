"""fast_jax.save_checkpoint / load_checkpoint on in-process clusters: saved on 4 ranks, resumed on 2 and 8 with
the consensus params and the ranks' average of the optax state; under async averaging a loaded checkpoint is not
pulled back toward the start (issue 13, point 3)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from test_jax_adapter import batch, loss_fn, make_params

import fast_jax as fast
from fast_core import LocalCluster
from fast_core.runtime.checkpoint import CheckpointError


def adam_step(strategy: str, engine, lr: float = 0.01):
    optimizer = optax.adam(lr)

    def train_step(params, opt_state, data):
        grads = jax.grad(loss_fn)(params, data)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, None

    params = make_params(engine.rank)
    return fast.distributed(jax.jit(train_step), strategy, engine=engine), params, optimizer.init(params)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(leaf, dtype=np.float64) for leaf in jax.tree_util.tree_leaves(tree)]


def test_saved_on_four_ranks_resumes_on_two_and_eight_with_the_averages(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.npz"

    def save(engine):
        step, params, opt_state = adam_step("async:ring", engine)
        for k in range(5 + engine.rank):  # the ranks part: their params and Adam moments differ
            params, opt_state, _ = step(params, opt_state, batch(engine.rank, k))
        step.close()
        fast.save_checkpoint(path, step, params, opt_state)
        return leaves(params), leaves(opt_state), step.worker.step

    saved = LocalCluster(4, timeout=240).run(save)
    mean_params = [np.mean([r[0][i] for r in saved], axis=0) for i in range(len(saved[0][0]))]
    mean_state = [np.mean([r[1][i] for r in saved], axis=0) for i in range(len(saved[0][1]))]
    assert not np.allclose(saved[0][0][0], saved[1][0][0])  # the average is not a copy of one rank

    def load(engine):
        step, params, opt_state = adam_step("async:ring", engine)
        params, opt_state, loaded = fast.load_checkpoint(path, step, params, opt_state)
        step.close()
        return leaves(params), leaves(opt_state), loaded.step, loaded.header["ranks"]

    for size in (2, 8):
        for params, state, step, ranks in LocalCluster(size, timeout=240).run(load):
            assert step == saved[0][2] and ranks == 4
            for got, want in zip(params, mean_params, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6)
            for got, want in zip(state, mean_state, strict=True):
                if want.ndim:  # the moments; the step count is an integer average
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)


def test_a_loaded_checkpoint_is_not_pulled_back_toward_the_start_under_async_averaging(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.npz"

    def save(engine):
        step, params, opt_state = adam_step("dpsgd:ring", engine)
        params = jax.tree_util.tree_map(lambda leaf: leaf * 0 + 1.0, params)  # every parameter 1.0
        step.start(params, opt_state)
        fast.save_checkpoint(path, step, params, opt_state)
        step.close()

    LocalCluster(2, timeout=240).run(save)

    def resume(engine):
        step, params, opt_state = adam_step("async:ring,keep_progress=false", engine, lr=0.0)
        params, opt_state, _ = fast.load_checkpoint(path, step, params, opt_state)
        for k in range(6):
            params, opt_state, _ = step(params, opt_state, batch(engine.rank, k))
        step.close()
        return leaves(params)

    for params in LocalCluster(3, timeout=240).run(resume):
        for leaf in params:
            np.testing.assert_allclose(leaf, 1.0, rtol=1e-6)  # lr 0: the loaded values, not the start's


def test_another_optimizers_state_is_refused_on_every_rank(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.npz"

    def save(engine):
        step, params, opt_state = adam_step("dpsgd:ring", engine)
        step.start(params, opt_state)
        fast.save_checkpoint(path, step, params, opt_state)
        step.close()

    LocalCluster(2, timeout=240).run(save)

    def load_with_sgd(engine):
        optimizer = optax.sgd(0.1, momentum=0.9)
        params = make_params(0)
        step = fast.distributed(jax.jit(lambda p, s, d: (p, s, None)), "dpsgd:ring", engine=engine)
        fast.load_checkpoint(path, step, params, optimizer.init(params))

    with pytest.raises(CheckpointError, match=r"optimizer state leaf '.*' is missing.*the optimizer the checkpoint"):
        LocalCluster(2, timeout=240).run(load_with_sgd)
