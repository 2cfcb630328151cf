"""fast_jax's state form on a Flax TrainState (and on any pytree state) against NumPy references, on 4 ranks; the
step's "loss" metric in the worker's records."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState
from jax_references import allreduce_momentum_reference, dpsgd_reference

import fast_jax as fast
from fast_core import LocalCluster
from fast_core.observers.base import Observer
from fast_core.observers.events import Recorded
from fast_core.topology import make_topology

FEATURES, CLASSES, LR, MOMENTUM, STEPS, SIZE, BATCH = 6, 3, 0.1, 0.9, 3, 4, 16
MODEL = nn.Dense(CLASSES)


def make_state(seed: int, tx: optax.GradientTransformation) -> TrainState:
    params = MODEL.init(jax.random.PRNGKey(seed), jnp.ones((1, FEATURES)))
    return TrainState.create(apply_fn=MODEL.apply, params=params, tx=tx)


def batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * rank + step)
    return rng.normal(size=(BATCH, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, BATCH)


def loss_and_grads(state: TrainState, data) -> tuple[jax.Array, dict]:
    def loss_fn(params):
        logits = state.apply_fn(params, data[0])
        return optax.softmax_cross_entropy_with_integer_labels(logits, data[1]).mean()

    return jax.value_and_grad(loss_fn)(state.params)


@jax.jit
def train_step(state: TrainState, data):
    loss, grads = loss_and_grads(state, data)
    return state.apply_gradients(grads=grads), {"loss": loss, "grads": grads}


@jax.jit
def grad_step(state: TrainState, data):
    loss, grads = loss_and_grads(state, data)
    return grads, {"loss": loss, "grads": grads}


def run(engine, strategy: str, fn, tx: optax.GradientTransformation):
    """Train STEPS steps from a different init on every rank; (start, final, gradients, step counter, state)."""
    step = fast.distributed(fn, strategy, engine=engine)
    state = step.start(make_state(engine.rank, tx))
    flat = fast.FlatTree(state.params)
    start, grads = flat.to_numpy(state.params).astype(np.float64), []
    for k in range(STEPS):
        state, metrics = step(state, batch(engine.rank, k))
        grads.append(flat.to_numpy(metrics["grads"]).astype(np.float64))
    step.close()
    return start, flat.to_numpy(state.params).astype(np.float64), grads, int(state.step), state


def test_dpsgd_mixes_a_train_states_params_as_the_numpy_reference() -> None:
    results = LocalCluster(SIZE, timeout=240).run(run, "dpsgd:ring", train_step, optax.sgd(LR))
    starts = np.stack([r[0] for r in results])
    np.testing.assert_array_equal(starts, np.broadcast_to(starts[0], starts.shape))  # rank 0's start everywhere
    states = dpsgd_reference(starts, [r[2] for r in results], "ring", LR)
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], states[rank], rtol=0, atol=2e-6)
        assert result[3] == STEPS  # the counter counts steps, never averaged
        assert isinstance(result[4], TrainState) and result[4].apply_fn == MODEL.apply
    assert np.abs(states[0] - states[1]).max() > 1e-3  # the ranks really differ: mixing was not trivial


def test_allreduce_applies_the_mean_gradient_through_the_states_tx() -> None:
    tx = optax.sgd(LR, momentum=MOMENTUM)
    results = LocalCluster(SIZE, timeout=240).run(run, "allreduce", grad_step, tx)
    for result in results[1:]:
        np.testing.assert_array_equal(result[1], results[0][1])  # identical replicas
    params, velocity = allreduce_momentum_reference(results[0][0], [r[2] for r in results], LR, MOMENTUM)
    np.testing.assert_allclose(results[0][1], params, rtol=0, atol=2e-6)
    assert [r[3] for r in results] == [STEPS] * SIZE
    trace = results[0][4].opt_state[0].trace  # the state's opt_state went through the update too
    np.testing.assert_allclose(fast.FlatTree(trace).to_numpy(trace), velocity, rtol=0, atol=2e-6)


def test_a_plain_pytree_state_mixes_floats_in_float32_and_keeps_counters() -> None:
    def step_fn(state, data):  # every rank adds its own number to w and b and counts in its own way
        add = data + 1.0
        new = {"w": state["w"] + add, "b": state["b"] + jnp.bfloat16(add), "count": state["count"] + 1 + data}
        return new, None

    def go(engine):
        step = fast.distributed(step_fn, "dpsgd:ring", engine=engine)
        state = {"w": jnp.full(2, 10.0 * engine.rank), "b": jnp.zeros(3, jnp.bfloat16), "count": jnp.int32(engine.rank)}
        for _ in range(STEPS):
            state, _ = step(state, engine.rank)
        return state, fast.average(state["b"], step=step)  # closes the step; bfloat16 averaged too

    states = LocalCluster(SIZE, timeout=240).run(go)
    graph = make_topology("ring", SIZE)
    x = np.zeros(SIZE)  # rank 0's start everywhere
    for k in range(STEPS):  # D-PSGD's X <- W X + own update, as for the gradients above
        x = graph.mixing_matrix(k) @ x + np.arange(SIZE) + 1.0
    for rank, (state, mean) in enumerate(states):
        assert mean.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(mean, np.float32), x.mean(), rtol=1e-2)
        assert state["b"].dtype == jnp.bfloat16 and state["w"].dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(state["w"]), x[rank], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(state["b"], np.float32), x[rank], rtol=1e-2)  # mixed, in bfloat16
        assert int(state["count"]) == STEPS * (rank + 1)  # rank 0's 0 at the start, then this rank's own counting


class Records(Observer):
    records = True

    def __init__(self) -> None:
        self.steps: list[dict] = []

    def on_record(self, event: Recorded) -> None:
        if event.kind == "step":
            self.steps.append(dict(event.values))


@pytest.mark.parametrize("form", ["state", "plain"])
def test_the_steps_loss_reaches_the_workers_records(form: str) -> None:
    tx = optax.sgd(LR)

    @jax.jit
    def plain_step(params, opt_state, data):
        state = make_state(0, tx).replace(params=params, opt_state=opt_state)
        new, metrics = train_step(state, data)
        return new.params, new.opt_state, {"loss": metrics["loss"]}

    def go(engine):
        records = Records()
        if form == "state":
            step = fast.distributed(train_step, "dpsgd:ring", engine=engine)
            state = step.start(make_state(0, tx))
        else:
            step = fast.distributed(plain_step, "dpsgd:ring", engine=engine)
            state = make_state(0, tx)
            params, opt_state = step.start(state.params, state.opt_state)
            state = state.replace(params=params, opt_state=opt_state)
        step.worker.observers.attach(records)
        losses = []
        for k in range(STEPS):
            data = batch(engine.rank, k)
            losses.append(float(loss_and_grads(state, data)[0]))
            if form == "state":
                state, _ = step(state, data)
            else:
                params, opt_state, _ = step(state.params, state.opt_state, data)
                state = state.replace(params=params, opt_state=opt_state)
        step.close()
        return losses, records.steps

    for losses, steps in LocalCluster(2, timeout=240).run(go):
        assert [r["samples"] for r in steps] == [BATCH] * STEPS
        np.testing.assert_allclose([r["loss"] for r in steps], losses, rtol=1e-5)


def test_the_state_form_explains_what_gradient_strategies_need() -> None:
    engine = LocalCluster(1).engine(0)
    with pytest.raises(TypeError, match=r"exchanges gradients.*no params, opt_state, tx, step.*TrainState"):
        fast.distributed(lambda state, data: (state, None), "allreduce", engine=engine)({"w": jnp.ones(2)}, 0)
    step = fast.distributed(train_step, "allreduce", engine=engine)  # a train_step where a grad_step belongs
    with pytest.raises(TypeError, match=r"grad_step\(state, batch\).*grads shaped like state.params"):
        step(make_state(0, optax.sgd(LR)), batch(0, 0))
