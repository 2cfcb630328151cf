"""fast_jax.DecoupledTrainer against the decoupled pipeline's rule in NumPy (tests/pipeline_reference.py, and
tests/pipeline_dpsgd_reference.py under D-PSGD): every parameter of every stage after the whole schedule, for
K x D = 1 x 4 (plain data parallelism), 2 x 2, 4 x 1 and 3 x 1 under all-reduce, 1 x 4 and 2 x 2 under D-PSGD on a
ring of replicas, and with a window, on the in-process engine; 2 x 2 under a real mpiexec too. The cases live in
jax_decoupled_cases.py (float32 layers against the float64 references)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax_decoupled_cases import (
    ATOL,
    BATCH,
    BATCHES,
    LR,
    RTOL,
    SIZES,
    check_stage,
    data,
    expected_layers,
    hidden,
    jax_layers,
    linear,
    loss,
    train_stage,
)
from mpirun import run_mpi
from pipeline_reference import LAYOUTS, check_evaluation, evaluation_between_steps, init_layers, train

import fast_jax as fast
from fast_core.engine.local import LocalCluster

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize(("stages", "replicas", "bounds"), LAYOUTS)
def test_every_parameter_follows_the_delayed_gradient_rule(stages: int, replicas: int, bounds: list[int]) -> None:
    results = LocalCluster(stages * replicas, timeout=240).run(train_stage, stages, bounds)
    expected, losses = train(init_layers(SIZES), bounds, data(replicas), LR)
    for result in results:
        check_stage(result["params"], expected, bounds[result["stage"]])
        if result["stage"] == stages - 1:
            assert len(result["losses"]) == BATCHES
            if replicas == 1:  # one replica: its losses are the reference's
                np.testing.assert_allclose(result["losses"], losses, rtol=RTOL, atol=ATOL)
    assert np.abs(expected[0][0] - init_layers(SIZES)[0][0]).max() > 1e-3  # the first stage did train


@pytest.mark.parametrize("window", [1, 2])
def test_a_window_bounds_the_delay_and_window_one_is_plain_training(window: int) -> None:
    bounds = [0, 1, 3, 4]
    expected, _ = train(init_layers(SIZES), bounds, data(1), LR, window=window)
    if window == 1:  # no batch overtakes another: the gradient of plain SGD
        plain, _ = train(init_layers(SIZES), [0, 4], data(1), LR)
        for mine, reference in zip(expected, plain, strict=True):
            np.testing.assert_allclose(mine[0], reference[0], rtol=1e-12, atol=1e-14)
    for result in LocalCluster(3, timeout=240).run(train_stage, 3, bounds, "allreduce", window):
        check_stage(result["params"], expected, bounds[result["stage"]])


@pytest.mark.parametrize(("stages", "replicas", "bounds"), [(1, 4, [0, 4]), (2, 2, [0, 2, 4])])
def test_dpsgd_mixes_each_stage_over_a_ring_of_its_replicas(stages: int, replicas: int, bounds: list[int]) -> None:
    expected = expected_layers("dpsgd:ring", bounds, replicas)
    for result in LocalCluster(stages * replicas, timeout=240).run(train_stage, stages, bounds, "dpsgd:ring"):
        check_stage(result["params"], expected[result["replica"]], bounds[result["stage"]])
    first = [expected[r][0][0] for r in range(replicas)]
    assert max(np.abs(a - first[0]).max() for a in first) > 1e-4  # the replicas differ: not all-reduce


@pytest.mark.mpi
def test_two_by_two_on_four_mpi_ranks_follows_the_references() -> None:
    output = run_mpi(4, HERE / "jax_decoupled_cases.py", timeout=180)  # a failed check exits nonzero: run_mpi fails
    assert output.count("matches the reference") == 2, output


def _bad_inputs(engine) -> None:
    layers = jax_layers(init_layers(SIZES))
    sgd = optax.sgd(LR)
    with pytest.raises(ValueError, match="must rise from 0 to 4 in 3 distinct boundaries"):
        fast.DecoupledTrainer(layers, 2, sgd, loss, split=[0, 4, 4], engine=engine)
    with pytest.raises(ValueError, match="split='time'"):
        fast.DecoupledTrainer(layers, 2, sgd, loss, split="time", engine=engine)
    with pytest.raises(ValueError, match="multiple of the number of stages"):
        fast.DecoupledTrainer(layers, 3, sgd, loss, engine=engine)
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        fast.DecoupledTrainer(layers, 2, lambda params: None, loss, engine=engine)
    with pytest.raises(TypeError, match="layer 1 is function: give each layer as a pair"):
        fast.DecoupledTrainer([layers[0], hidden], 2, sgd, loss, engine=engine)
    trainer = fast.DecoupledTrainer(layers, 2, sgd, loss, engine=engine)
    if trainer.stage == 0:
        with pytest.raises(ValueError, match="stage 0 reads the data"):
            trainer.step(None, np.zeros(BATCH, dtype=np.int64))
    else:
        with pytest.raises(ValueError, match="the last stage computes the loss"):
            trainer.step(np.zeros((BATCH, SIZES[0]), dtype=np.float32), None)


def test_bad_input_is_named_on_every_rank() -> None:
    LocalCluster(2, timeout=240).run(_bad_inputs)


def _no_parameter(engine) -> None:
    with pytest.raises(ValueError, match=r"stage 0 \(layers 0..1\) has no trainable parameter"):
        fast.DecoupledTrainer([(lambda p, x: jnp.tanh(x), {})], 1, optax.sgd(LR), loss, engine=engine)


def test_a_stage_without_parameters_is_refused() -> None:
    LocalCluster(1, timeout=240).run(_no_parameter)


def _evaluate(engine) -> tuple[float, float]:
    trainer = fast.DecoupledTrainer(jax_layers(init_layers(SIZES)), 2, optax.sgd(LR), loss, engine=engine)
    return evaluation_between_steps(trainer, lambda a: a.astype(np.float32) if a.dtype.kind == "f" else a, SIZES, BATCH)


def test_the_pipeline_evaluates_between_steps_without_disturbing_training() -> None:
    check_evaluation(LocalCluster(2, timeout=240).run(_evaluate), SIZES)


def _timed_split(engine) -> list[int]:
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    shapes = [(8, 8), (8, 600), (600, 600), (600, 8)]
    layers = [
        (hidden, {"w": jax.random.normal(k, s) / 30, "b": jnp.zeros(s[1])}) for k, s in zip(keys, shapes, strict=True)
    ]
    sample = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
    return fast.DecoupledTrainer(layers, 2, optax.sgd(LR), loss, split=sample, engine=engine).bounds


def test_a_sample_batch_splits_by_measured_time_the_same_on_every_rank() -> None:
    first, second = LocalCluster(2, timeout=240).run(_timed_split)
    assert first == second and first[0] == 0 and first[-1] == 4 and first[1] in (2, 3)  # the 600x600 layer weighs most


def _embedding(p: dict, tokens: jax.Array) -> jax.Array:
    return p["table"][tokens].mean(axis=1)


def _token_model() -> tuple[list[tuple], list[tuple[np.ndarray, np.ndarray]]]:
    """An embedding of integer tokens (no gradient to stage 0's input), a hidden and a linear layer; batches."""
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    layers = [
        (_embedding, {"table": jax.random.normal(keys[0], (11, 6))}),
        (hidden, {"w": jax.random.normal(keys[1], (6, 8)) / 3, "b": jnp.zeros(8)}),
        (linear, {"w": jax.random.normal(keys[2], (8, 4)) / 3, "b": jnp.zeros(4)}),
    ]
    rng = np.random.default_rng(7)
    return layers, [(rng.integers(0, 11, (BATCH, 3)), rng.integers(0, 4, BATCH)) for _ in range(BATCHES)]


def _tokens(engine) -> list:
    layers, batches = _token_model()
    trainer = fast.DecoupledTrainer(layers, 3, optax.sgd(LR), loss, split=[0, 1, 2, 3], window=1, engine=engine)
    for x, y in batches:
        trainer.step(x, y)
    trainer.finish()
    return trainer.params


def test_integer_tokens_feed_stage_zero_and_window_one_is_plain_jax_sgd() -> None:
    layers, batches = _token_model()
    fns, params = [fn for fn, _ in layers], [p for _, p in layers]

    def whole(params: list, x: jax.Array, y: jax.Array) -> jax.Array:
        for fn, p in zip(fns, params, strict=True):
            x = fn(p, x)
        return loss(x, y)

    for x, y in batches:  # plain SGD in one process
        params = jax.tree_util.tree_map(lambda p, g: p - LR * g, params, jax.grad(whole)(params, x, y))
    for stage, trained in enumerate(LocalCluster(3, timeout=240).run(_tokens)):
        for name, value in trained[0].items():
            np.testing.assert_allclose(value, params[stage][name], rtol=1e-5, atol=1e-6, err_msg=f"{stage} {name}")
    assert np.abs(params[0]["table"] - layers[0][1]["table"]).max() > 1e-3  # the embedding did train
