"""fast_jax.DecoupledTrainer against the decoupled pipeline's rule in NumPy (tests/pipeline_reference.py): every
parameter of every stage after the whole schedule, for K x D = 1 x 4 (plain data parallelism), 2 x 2, 4 x 1 and
3 x 1 under all-reduce, under D-PSGD on a ring of replicas, and with a window, on the in-process engine. The JAX
layers are float32, the reference float64: compared to float32's accuracy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from pipeline_reference import cross_entropy_grad, init_layers, stage_backward, stage_forward, train

import fast_jax as fast
from fast_core.engine.local import LocalCluster
from fast_core.pipeline.schedule import Schedule
from fast_core.topology import make_topology

SIZES = [6, 8, 8, 5, 4]  # four dense layers
BATCH, BATCHES, LR = 5, 7, 0.2
RTOL, ATOL = 2e-4, 2e-5  # float32 against float64


def _hidden(p: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ p["w"] + p["b"])


def _linear(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def _layers(layers: list[list[np.ndarray]]) -> list[tuple]:
    """The reference's layers as (apply_fn, params) in float32: tanh after each but the last."""
    params = [{"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)} for w, b in layers]
    return [(_linear if i == len(layers) - 1 else _hidden, p) for i, p in enumerate(params)]


def _loss(logits: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def _data(replicas: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(3)
    return [
        [(rng.normal(size=(BATCH, SIZES[0])), rng.integers(0, SIZES[-1], BATCH)) for _ in range(BATCHES)]
        for _ in range(replicas)
    ]


def _train(engine, stages: int, bounds: list[int], strategy: str = "allreduce", window: int | None = None) -> dict:
    trainer = fast.DecoupledTrainer(
        _layers(init_layers(SIZES)),
        stages,
        optimizer=optax.sgd(LR),
        loss_fn=_loss,
        strategy=strategy,
        split=bounds,
        window=window,
        engine=engine,
    )
    losses = []
    for x, y in _data(engine.size // stages)[trainer.replica]:
        loss = trainer.step(x.astype(np.float32), y)
        losses += [] if loss is None else [loss]
    losses += trainer.finish()
    params = [{k: np.asarray(v, np.float64) for k, v in p.items()} for p in trainer.params]
    return {"stage": trainer.stage, "replica": trainer.replica, "params": params, "losses": losses}


def _check(params: list[dict], expected: list[list[np.ndarray]], first: int) -> None:
    """A stage's parameters against the reference's layers (the stage's first layer is ``first``)."""
    for i, layer in enumerate(params):
        for kind, index in (("w", 0), ("b", 1)):
            np.testing.assert_allclose(
                layer[kind], expected[first + i][index], rtol=RTOL, atol=ATOL, err_msg=f"layer {first + i} {kind}"
            )


@pytest.mark.parametrize(
    ("stages", "replicas", "bounds"), [(1, 4, [0, 4]), (2, 2, [0, 2, 4]), (4, 1, [0, 1, 2, 3, 4]), (3, 1, [0, 1, 3, 4])]
)
def test_every_parameter_follows_the_delayed_gradient_rule(stages: int, replicas: int, bounds: list[int]) -> None:
    results = LocalCluster(stages * replicas, timeout=60).run(_train, stages, bounds)
    expected, losses = train(init_layers(SIZES), bounds, _data(replicas), LR)
    for result in results:
        _check(result["params"], expected, bounds[result["stage"]])
        if result["stage"] == stages - 1:
            assert len(result["losses"]) == BATCHES
            if replicas == 1:  # one replica: its losses are the reference's
                np.testing.assert_allclose(result["losses"], losses, rtol=RTOL, atol=ATOL)
    assert np.abs(expected[0][0] - init_layers(SIZES)[0][0]).max() > 1e-3  # the first stage did train


@pytest.mark.parametrize("window", [1, 2])
def test_a_window_bounds_the_delay_and_window_one_is_plain_training(window: int) -> None:
    bounds = [0, 1, 3, 4]
    expected, _ = train(init_layers(SIZES), bounds, _data(1), LR, window=window)
    if window == 1:  # no batch overtakes another: the gradient of plain SGD
        plain, _ = train(init_layers(SIZES), [0, 4], _data(1), LR)
        for mine, reference in zip(expected, plain, strict=True):
            np.testing.assert_allclose(mine[0], reference[0], rtol=1e-12, atol=1e-14)
    for result in LocalCluster(3, timeout=60).run(_train, 3, bounds, "allreduce", window):
        _check(result["params"], expected, bounds[result["stage"]])


def _dpsgd_reference(bounds: list[int], batches: list[list[tuple[np.ndarray, np.ndarray]]]) -> list[list]:
    """Every replica's layers after the decoupled rule under D-PSGD on a ring of each stage's replicas: replica r of
    stage k updates with its own gradient and mixes, X <- W X - lr G (W of the stage's update count)."""
    stages, replicas, count = len(bounds) - 1, len(batches), len(batches[0])
    mixing = make_topology("ring", replicas)
    layers = [[[a.copy() for a in layer] for layer in init_layers(SIZES)] for _ in range(replicas)]
    schedule = Schedule(stages, count)
    sent: dict[tuple[str, int, int, int], np.ndarray] = {}  # (direction, stage receiving, batch, replica)
    stash: dict[tuple[int, int, int], tuple] = {}
    updates_done = [0] * stages
    for tick in range(schedule.ticks):
        arriving, updates = {}, []
        for k in range(stages):
            own, last = range(bounds[k], bounds[k + 1]), k == stages - 1
            batch = schedule.forward_batch(k, tick)
            if batch is not None:
                for r in range(replicas):
                    weights = [[a.copy() for a in layers[r][i]] for i in own]
                    x = batches[r][batch][0] if k == 0 else sent.pop(("forward", k, batch, r))
                    out, inputs = stage_forward(weights, x, last)
                    stash[(k, batch, r)] = (weights, inputs, out)
                    if not last:
                        arriving[("forward", k + 1, batch, r)] = out
            batch = schedule.backward_batch(k, tick)
            if batch is None:
                continue
            grads = []
            for r in range(replicas):
                weights, inputs, out = stash.pop((k, batch, r))
                g = cross_entropy_grad(out, batches[r][batch][1])[1] if last else sent.pop(("back", k, batch, r))
                g_layers, g_in = stage_backward(weights, inputs, g, last)
                grads.append(g_layers)
                if k > 0:
                    arriving[("back", k - 1, batch, r)] = g_in
            updates.append((k, grads))
        for k, grads in updates:
            w = mixing.mixing_matrix(updates_done[k])
            updates_done[k] += 1
            for i_local, i in enumerate(range(bounds[k], bounds[k + 1])):
                for part in (0, 1):
                    current = [layers[r][i][part] for r in range(replicas)]
                    for r in range(replicas):
                        mixed = sum(w[r, j] * current[j] for j in range(replicas))
                        layers[r][i][part] = mixed - LR * grads[r][i_local][part]
        sent.update(arriving)
    return layers


@pytest.mark.parametrize(("stages", "replicas", "bounds"), [(1, 4, [0, 4]), (2, 2, [0, 2, 4])])
def test_dpsgd_mixes_each_stage_over_a_ring_of_its_replicas(stages: int, replicas: int, bounds: list[int]) -> None:
    expected = _dpsgd_reference(bounds, _data(replicas))
    results = LocalCluster(stages * replicas, timeout=60).run(_train, stages, bounds, "dpsgd:ring")
    for result in results:
        _check(result["params"], expected[result["replica"]], bounds[result["stage"]])
    first = [expected[r][0][0] for r in range(replicas)]
    assert max(np.abs(a - first[0]).max() for a in first) > 1e-4  # the replicas differ: not all-reduce


def _bad_inputs(engine) -> None:
    layers = _layers(init_layers(SIZES))
    sgd = optax.sgd(LR)
    with pytest.raises(ValueError, match="must rise from 0 to 4 in 3 distinct boundaries"):
        fast.DecoupledTrainer(layers, 2, sgd, _loss, split=[0, 4, 4], engine=engine)
    with pytest.raises(ValueError, match="split='time'"):
        fast.DecoupledTrainer(layers, 2, sgd, _loss, split="time", engine=engine)
    with pytest.raises(ValueError, match="multiple of the number of stages"):
        fast.DecoupledTrainer(layers, 3, sgd, _loss, engine=engine)
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        fast.DecoupledTrainer(layers, 2, lambda params: None, _loss, engine=engine)
    with pytest.raises(TypeError, match="layer 1 is function: give each layer as a pair"):
        fast.DecoupledTrainer([layers[0], _hidden], 2, sgd, _loss, engine=engine)
    trainer = fast.DecoupledTrainer(layers, 2, sgd, _loss, engine=engine)
    if trainer.stage == 0:
        with pytest.raises(ValueError, match="stage 0 reads the data"):
            trainer.step(None, np.zeros(BATCH, dtype=np.int64))
    else:
        with pytest.raises(ValueError, match="the last stage computes the loss"):
            trainer.step(np.zeros((BATCH, SIZES[0]), dtype=np.float32), None)


def test_bad_input_is_named_on_every_rank() -> None:
    LocalCluster(2, timeout=30).run(_bad_inputs)


def _no_parameter(engine) -> None:
    with pytest.raises(ValueError, match=r"stage 0 \(layers 0..1\) has no trainable parameter"):
        fast.DecoupledTrainer([(lambda p, x: jnp.tanh(x), {})], 1, optax.sgd(LR), _loss, engine=engine)


def test_a_stage_without_parameters_is_refused() -> None:
    LocalCluster(1, timeout=30).run(_no_parameter)


def _evaluate(engine) -> tuple[float, float]:
    trainer = fast.DecoupledTrainer(_layers(init_layers(SIZES)), 2, optax.sgd(LR), _loss, engine=engine)
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(23, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], 23)
    trainer.step(x[:BATCH], y[:BATCH])  # a batch in flight in the training pipeline
    accuracy = trainer.evaluate(x, y, batch_size=10)
    trainer.step(x[BATCH : 2 * BATCH], y[BATCH : 2 * BATCH])
    trainer.finish()
    return accuracy, trainer.evaluate(x, y, batch_size=7)


def test_the_pipeline_evaluates_between_steps_without_disturbing_training() -> None:
    results = LocalCluster(2, timeout=30).run(_evaluate)
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(23, SIZES[0])), rng.integers(0, SIZES[-1], 23)
    logits, _ = stage_forward(init_layers(SIZES), x, last=True)
    assert results[0][0] == results[1][0] == pytest.approx(np.mean(logits.argmax(1) == y))  # nothing updated yet
    assert results[0][1] == results[1][1]


def _timed_split(engine) -> list[int]:
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    shapes = [(8, 8), (8, 600), (600, 600), (600, 8)]
    layers = [
        (_hidden, {"w": jax.random.normal(k, s) / 30, "b": jnp.zeros(s[1])}) for k, s in zip(keys, shapes, strict=True)
    ]
    sample = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
    return fast.DecoupledTrainer(layers, 2, optax.sgd(LR), _loss, split=sample, engine=engine).bounds


def test_a_sample_batch_splits_by_measured_time_the_same_on_every_rank() -> None:
    first, second = LocalCluster(2, timeout=60).run(_timed_split)
    assert first == second and first[0] == 0 and first[-1] == 4 and first[1] in (2, 3)  # the 600x600 layer weighs most
