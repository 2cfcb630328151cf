"""fast_jax in one process (LocalCluster threads): both step forms against NumPy references, no retracing, lazy
host copies, broadcast/average/shard, and every error a user can hit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from diloco_reference import DiLoCoReference
from jax_references import allreduce_momentum_reference, dpsgd_reference

import fast_jax as fast
from fast_core import LocalCluster, ModelMismatchError
from fast_core.config.current import forget_run_config
from fast_core.topology import make_topology

FEATURES, HIDDEN, CLASSES, LR, MOMENTUM, STEPS = 6, 5, 3, 0.1, 0.9, 8


def make_params(seed: int = 0) -> dict:
    """A nested pytree (dict of dict and tuple) of float32 leaves."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "dense": {"w": jax.random.normal(k1, (FEATURES, HIDDEN)), "b": jnp.zeros(HIDDEN)},
        "head": (jax.random.normal(k2, (HIDDEN, CLASSES)), jnp.full(CLASSES, 0.1)),
    }


def loss_fn(params: dict, batch: tuple[np.ndarray, np.ndarray]) -> jax.Array:
    x, y = batch
    hidden = jnp.tanh(x @ params["dense"]["w"] + params["dense"]["b"])
    logits = hidden @ params["head"][0] + params["head"][1]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def batch(rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 * rank + step)
    return rng.normal(size=(16, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, 16)


def make_step(
    strategy: str, form: str, optimizer: optax.GradientTransformation, engine, traces: list | None = None, seed: int = 0
):
    """(step, params, opt_state): the step in the plain form (train_step) or the gradient form (grad_step +
    optimizer), whose metrics are the gradient the rank computed, so tests can replay it in NumPy."""

    def train_step(params, opt_state, data):
        if traces is not None:
            traces.append(1)  # runs only while JAX traces
        grads = jax.grad(loss_fn)(params, data)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads

    def grad_step(params, data):
        if traces is not None:
            traces.append(1)
        grads = jax.grad(loss_fn)(params, data)
        return grads, grads

    if form == "plain":
        step = fast.distributed(jax.jit(train_step), strategy, engine=engine)
    else:
        step = fast.distributed(jax.jit(grad_step), strategy, optimizer=optimizer, engine=engine)
    params = make_params(seed)
    return step, params, optimizer.init(params)


def record(engine, strategy: str, form: str, optimizer=None, steps: int = STEPS):
    """Train ``steps`` steps; return (start, final params, gradients per step) as flat float64 buffers."""
    optimizer = optimizer or optax.sgd(LR)
    # different inits on each rank: the step must start every rank from rank 0's
    step, params, opt_state = make_step(strategy, form, optimizer, engine, seed=engine.rank)
    params, opt_state = step.start(params, opt_state)
    flat = fast.FlatTree(params)
    start = flat.to_numpy(params)
    grads = []
    for k in range(steps):
        params, opt_state, g = step(params, opt_state, batch(engine.rank, k))
        grads.append(flat.to_numpy(g).astype(np.float64))
    step.close()
    return start.astype(np.float64), flat.to_numpy(params).astype(np.float64), grads


@pytest.mark.parametrize("form", ["plain", "gradient"])
def test_dpsgd_through_the_step_matches_the_numpy_reference(form: str) -> None:
    size = 4
    results = LocalCluster(size, timeout=240).run(record, "dpsgd:ring", form)
    starts = np.stack([r[0] for r in results])
    np.testing.assert_array_equal(starts, np.broadcast_to(starts[0], starts.shape))  # rank 0's start everywhere
    states = dpsgd_reference(starts, [r[2] for r in results], "ring", LR)
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], states[rank], rtol=0, atol=2e-6)
    assert np.abs(states[0] - states[1]).max() > 1e-3  # the ranks really differ: mixing was not trivial


def test_diloco_through_the_string_matches_the_numpy_reference() -> None:
    results = LocalCluster(4, timeout=240).run(record, "diloco:period=2", "plain")
    states = DiLoCoReference(period=2).replay(np.stack([r[0] for r in results]), [r[2] for r in results], LR)
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], states[rank], rtol=0, atol=2e-6)


def test_allreduce_equals_one_model_on_the_mean_gradient_with_momentum() -> None:
    results = LocalCluster(4, timeout=240).run(record, "allreduce", "gradient", optax.sgd(LR, momentum=MOMENTUM))
    for result in results[1:]:
        np.testing.assert_array_equal(result[1], results[0][1])  # identical replicas
    params, _ = allreduce_momentum_reference(results[0][0], [r[2] for r in results], LR, MOMENTUM)
    np.testing.assert_allclose(results[0][1], params, rtol=0, atol=2e-6)


def test_fast_applies_neighbour_gradients_through_the_optax_optimizer() -> None:
    size = 4
    optimizer = optax.sgd(LR, momentum=MOMENTUM)  # stateful: the order own, then neighbours in rank order, matters
    results = LocalCluster(size, timeout=240).run(record, "fast:torus,synchronous=true", "gradient", optimizer)
    graph = make_topology("torus", size)
    params = np.stack([r[0] for r in results])
    velocity = np.zeros_like(params)
    for k in range(STEPS):
        grads = [r[2][k] for r in results]
        for rank in range(size):
            for g in [grads[rank]] + [grads[p] for p in graph.in_neighbors(rank)]:
                velocity[rank] = g + MOMENTUM * velocity[rank]
                params[rank] -= LR * velocity[rank]
    for rank, result in enumerate(results):
        np.testing.assert_allclose(result[1], params[rank], rtol=0, atol=5e-6)


def _restart(engine, reset: bool):
    optimizer = optax.sgd(LR, momentum=MOMENTUM)
    step, params, opt_state = make_step(
        f"fast:torus,reset_optimizer={str(reset).lower()}", "gradient", optimizer, engine
    )
    for k in range(3):
        params, opt_state, _ = step(params, opt_state, batch(engine.rank, k))
    mine = fast.FlatTree(params).to_numpy(params)
    params, opt_state = step.end_epoch(params, opt_state, metric=[0.1, 0.9, 0.5, 0.9][engine.rank])
    step.close()
    return mine, fast.FlatTree(params).to_numpy(params), fast.FlatTree(params).to_numpy(opt_state[0].trace)


@pytest.mark.parametrize("reset", [False, True])
def test_fast_end_epoch_restarts_every_rank_from_the_best_replica(reset: bool) -> None:
    results = LocalCluster(4, timeout=240).run(_restart, reset)
    assert np.abs(results[1][0] - results[0][0]).max() > 1e-4  # replicas had drifted apart
    for _, restarted, momentum in results:
        np.testing.assert_array_equal(restarted, results[1][0])  # rank 1: best metric, lowest rank on the tie
        assert (np.abs(momentum).max() == 0) == reset


@pytest.mark.parametrize(("strategy", "form"), [("dpsgd:ring", "plain"), ("allreduce", "gradient")])
def test_the_users_jitted_function_is_traced_once(strategy: str, form: str) -> None:
    def run(engine):
        traces: list[int] = []
        step, params, opt_state = make_step(strategy, form, optax.sgd(LR), engine, traces)
        for k in range(30):
            params, opt_state, _ = step(params, opt_state, batch(engine.rank, k))
            params, opt_state = step.end_epoch(params, opt_state, 0.5) if k % 10 == 9 else (params, opt_state)
        step.close()
        return len(traces)

    assert LocalCluster(2, timeout=240).run(run) == [1, 1]


@pytest.mark.parametrize(
    ("strategy", "form", "gets", "puts"),
    [
        ("dpsgd:ring", "plain", 1, 1),  # params out, mixed params back
        ("allreduce", "gradient", 1, 1),  # gradient out, mean gradient back; params stay on the device
        ("localsgd:period=4", "plain", 0.25, 0.25),  # only the averaging steps move anything
        ("diloco:period=4", "plain", 0.25, 0.25),  # only the outer steps
        ("dpsgd:ring", "gradient", 1, 1),
    ],
)
def test_one_transfer_each_way_per_step_and_none_when_nothing_is_mixed(
    monkeypatch, strategy: str, form: str, gets: float, puts: float
) -> None:
    counts = {"get": 0, "put": 0}
    to_numpy, from_numpy = fast.FlatTree.to_numpy, fast.FlatTree.from_numpy
    steps = 16

    def counting(kind, fn):
        def wrapped(self, *args, **kwargs):
            counts[kind] += 1
            return fn(self, *args, **kwargs)

        return wrapped

    def run(engine):
        step, params, opt_state = make_step(strategy, form, optax.sgd(LR), engine)
        params, opt_state = step.start(params, opt_state)
        engine.barrier()
        if engine.rank == 0:
            monkeypatch.setattr(fast.FlatTree, "to_numpy", counting("get", to_numpy))
            monkeypatch.setattr(fast.FlatTree, "from_numpy", counting("put", from_numpy))
        engine.barrier()
        for k in range(steps):
            params, opt_state, _ = step(params, opt_state, batch(engine.rank, k))
        engine.barrier()
        step.close()

    LocalCluster(2, timeout=240).run(run)
    assert counts == {"get": 2 * gets * steps, "put": 2 * puts * steps}  # two ranks counted


def _two_rank_average(engine) -> dict:
    value = float(engine.rank + 1)
    tree = {"a": jnp.full((2, 3), value), "half": jnp.full(4, value, dtype=jnp.float16)}
    return fast.average(tree, engine=engine)


def test_average_is_the_mean_over_ranks_in_each_leafs_dtype() -> None:
    results = LocalCluster(2).run(_two_rank_average)
    for result in results:
        np.testing.assert_array_equal(result["a"], np.full((2, 3), 1.5, np.float32))
        assert result["half"].dtype == jnp.float16 and float(result["half"][0]) == 1.5


def test_broadcast_sends_roots_pytree_of_any_dtypes() -> None:
    def run(engine):
        tree = {"w": jnp.full(3, engine.rank, jnp.float32), "count": jnp.array(engine.rank, jnp.int32), "m": [True]}
        return fast.broadcast(tree, root=2, engine=engine)

    for result in LocalCluster(3).run(run):
        np.testing.assert_array_equal(result["w"], [2.0, 2.0, 2.0])
        assert int(result["count"]) == 2 and result["count"].dtype == jnp.int32
        assert bool(result["m"][0])


def test_broadcast_and_average_name_a_leaf_that_differs_between_ranks() -> None:
    def run(engine):
        tree = {"w": jnp.zeros(3 + engine.rank)}
        with pytest.raises(ModelMismatchError, match=r"rank 1 .*'w' shape=\(4,\)"):
            fast.broadcast(tree, engine=engine)
        with pytest.raises(ModelMismatchError, match="rank 1"):
            fast.average(tree, engine=engine)

    LocalCluster(2).run(run)


def test_shard_deals_aligned_disjoint_shares() -> None:
    x, y = np.arange(10.0)[:, None] * np.ones((1, 2)), np.arange(10)

    def mine(engine):
        return fast.shard(x, y, engine=engine), fast.shard(x, y, engine=engine, drop_last=True)

    parts = LocalCluster(3).run(mine)
    shares = [p[0] for p in parts]
    for xs, ys in shares:
        np.testing.assert_array_equal(xs[:, 0], ys)  # rows stay with their labels
    taken = np.concatenate([ys for _, ys in shares]).tolist()
    assert [len(ys) for _, ys in shares] == [4, 4, 4]  # equal shares: padded with 2 repeated samples
    assert set(taken) == set(range(10)) and len(set(taken)) == 10
    dropped = np.concatenate([p[1][1] for p in parts]).tolist()
    assert [len(p[1][1]) for p in parts] == [3, 3, 3] and len(set(dropped)) == 9  # cut: disjoint, one left out
    with pytest.raises(ValueError, match="one length"):
        fast.shard(x, y[:5], engine=LocalCluster(1).engine(0))


def test_flat_tree_round_trip_is_exact_and_does_not_alias_the_host_buffer() -> None:
    params = make_params()
    flat = fast.FlatTree(params)
    assert flat.layout.names == ["dense/b", "dense/w", "head/0", "head/1"]
    saved = flat.to_numpy(params)
    # The device pytree must not change with the host buffer the strategies mix into. On the CPU, jax.device_put
    # aliases a NumPy array whose memory is 64-byte aligned instead of copying it, so try every alignment.
    storage = np.zeros(flat.layout.size + 16, dtype=saved.dtype)
    for start in range(16):
        host = storage[start : start + flat.layout.size]
        flat.to_numpy(params, out=host)
        back = flat.from_numpy(host)
        host += 1.0
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back), strict=True):
            np.testing.assert_array_equal(a, b)
    out = np.zeros_like(saved)
    assert flat.to_numpy(params, out=out) is out
    np.testing.assert_array_equal(out, saved)


def test_mixed_dtypes_are_refused_unless_a_buffer_dtype_is_chosen() -> None:
    params = {"w": jnp.ones(3, jnp.float32), "b": jnp.ones(2, jnp.bfloat16)}
    with pytest.raises(TypeError, match=r"several dtypes .*'b' bfloat16.*dtype='float32'"):
        fast.FlatTree(params)
    with pytest.raises(TypeError, match=r"params are bfloat16.*dtype='float32'"):
        fast.FlatTree({"b": params["b"]})
    with pytest.raises(TypeError, match="'step' has dtype int32.*floating point"):
        fast.FlatTree({"w": params["w"], "step": jnp.zeros((), jnp.int32)})
    with pytest.raises(ValueError, match="no leaves"):
        fast.FlatTree({})

    def run(engine):  # documented promotion: mixed in float32, each leaf cast back to its own dtype
        optimizer = optax.sgd(0.0)

        def train_step(p, s, data):
            return jax.tree.map(lambda leaf: leaf + data.astype(leaf.dtype), p), s, None

        step = fast.distributed(jax.jit(train_step), "dpsgd:ring", engine=engine, dtype="float32")
        tree = {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros(2, jnp.bfloat16)}
        tree, _ = step.start(tree, optimizer.init(tree))
        tree, _, _ = step(tree, None, jnp.float32(engine.rank))  # rank r moves to r (mixing the zero starts)
        tree, _, _ = step(tree, None, jnp.float32(0.0))  # then averages with its ring neighbours
        step.close()
        return tree

    for rank, tree in enumerate(LocalCluster(4).run(run)):
        assert tree["b"].dtype == jnp.bfloat16 and tree["w"].dtype == jnp.float32
        mixed = (rank + (rank - 1) % 4 + (rank + 1) % 4) / 3  # ring weights 1/3
        np.testing.assert_allclose(np.asarray(tree["w"]), mixed, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(tree["b"], np.float32), mixed, rtol=1e-2)


def test_gradient_strategies_in_the_plain_form_say_which_form_to_use(monkeypatch) -> None:
    def train_step(params, opt_state, data):
        return params, opt_state, None

    for strategy in ["allreduce", "fast:torus", "dpsgd:ring,warmup=10"]:
        with pytest.raises(ValueError, match=r"exchanges gradients.*optimizer=.*grad_step\(params, batch\)"):
            fast.distributed(train_step, strategy)
    monkeypatch.delenv("FAST_STRATEGY", raising=False)
    with pytest.raises(ValueError, match=r"no strategy given.*all-reduce"):
        fast.distributed(train_step)
    monkeypatch.setenv("FAST_STRATEGY", "dpsgd:ring")
    forget_run_config()  # as a new process: this one read its configuration above
    assert fast.distributed(train_step).strategy.name == "dpsgd"


def test_bad_steps_get_clear_errors() -> None:
    def train_step(params, opt_state, data):
        return params, opt_state

    def grad_step(params, data):
        return jax.grad(loss_fn)(params, data), None

    stateful = fast.distributed(grad_step, "dpsgd:ring")  # two arguments, no optimizer: the state form
    with pytest.raises(TypeError, match=r"state form.*got 3 arguments.*grad_step\(params, batch\).*pass optimizer="):
        stateful(make_params(), None, batch(0, 0))
    with pytest.raises(TypeError, match=r"cannot be called as grad_step.*drop optimizer="):
        fast.distributed(train_step, "allreduce", optimizer=optax.sgd(LR))
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        fast.distributed(grad_step, "allreduce", optimizer=lambda g: g)

    engine = LocalCluster(1).engine(0)
    step = fast.distributed(train_step, "dpsgd:ring", engine=engine)
    with pytest.raises(RuntimeError, match="has not started"):
        step.worker  # noqa: B018 - the property raises
    with pytest.raises(RuntimeError, match="before the first step"):
        step.end_epoch(make_params(), None, 0.5)
    with pytest.raises(TypeError, match=r"must be train_step.*returned a 2-tuple"):
        step(make_params(), None, batch(0, 0))
    step.close()

    good = fast.distributed(lambda p, s, d: (p, s, None), "dpsgd:ring", engine=LocalCluster(1).engine(0))
    params, state, _ = good(make_params(), None, None)
    with pytest.raises(ValueError, match="no longer has the structure"):
        good({"other": params["dense"]}, state, None)
    with pytest.raises(ValueError, match=r"'dense/b' has shape \(7,\), expected \(5,\)"):
        good({**params, "dense": {"w": params["dense"]["w"], "b": jnp.zeros(7)}}, state, None)
    good.close()
    with pytest.raises(RuntimeError, match="closed"):
        good(params, state, None)


def test_ranks_with_different_models_are_refused_naming_the_leaf() -> None:
    def run(engine):
        params = make_params()
        if engine.rank == 1:
            params["head"] = (params["head"][0], jnp.zeros(CLASSES + 1))
        step = fast.distributed(lambda p, s, d: (p, s, None), "dpsgd:ring", engine=engine)
        with pytest.raises(ModelMismatchError, match=r"rank 1 .*'head/1' shape=\(4,\)"):
            step(params, None, None)

    LocalCluster(2).run(run)


def test_decorator_form_and_single_process_runtime() -> None:
    @fast.distributed(strategy="dpsgd:ring", engine=LocalCluster(1).engine(0))
    @jax.jit
    def train_step(params, opt_state, data):
        return jax.tree.map(lambda p: p - 1.0, params), opt_state, None

    params, _, _ = train_step({"w": jnp.zeros(2)}, None, None)
    np.testing.assert_array_equal(params["w"], [-1.0, -1.0])  # one rank: D-PSGD is plain training
    assert isinstance(train_step, fast.DistributedStep)
    train_step.close()
    assert (fast.rank(), fast.size()) == (0, 1)  # no MPI launcher: one local worker
