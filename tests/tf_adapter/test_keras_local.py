"""fast_tf in this process (the TensorFlow Keras backend): the multi-rank cases on a LocalCluster, and every error
a user can run into, each with the message that says what to do."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from diloco_reference import DiLoCoReference
from keras_cases import ATOL, BATCH, CASES, CLASSES, FEATURES, LR, flat_weights, make_model, rank_data, simulate
from keras_cases import fit as fit_on_rank

import fast_tf as fast
from fast_core import ConfigError, Engine, LocalCluster


@pytest.mark.parametrize("size", [1, 4])
@pytest.mark.parametrize("name", list(CASES))
def test_case_on_local_cluster(name: str, size: int) -> None:
    LocalCluster(size, timeout=240).run(CASES[name])


def one_rank() -> Engine:
    return LocalCluster(1).engine(0)


def fit(model: keras.Model, callback: fast.Callback | None, data=None, **options) -> None:
    x, y = rank_data(0) if data is None else data
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[callback] if callback else [], **options)


# models the adapter refuses -------------------------------------------------------------------------------------
def test_variables_of_several_dtypes_are_refused_with_their_names() -> None:
    layers = [keras.layers.Dense(4), keras.layers.Dense(CLASSES, dtype="float64")]
    model = keras.Sequential([keras.Input((FEATURES,)), *layers])
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(TypeError, match=r"float32 \(first: '0:kernel'\), float64 \(first: '2:kernel'\).*same dtype"):
        fit(model, fast.Callback("dpsgd:ring", engine=one_rank()))


def test_integer_variables_are_refused() -> None:
    with pytest.raises(TypeError, match="'0:counter' is int32; FAST mixes float16, float32, float64"):
        fast.layout_of([keras.Variable(np.zeros(3, dtype="int32"), name="counter")])


def test_a_model_without_trainable_variables_is_refused() -> None:
    model = make_model(one_rank(), keras.optimizers.SGD(LR))
    model.trainable = False
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="no trainable variable"):
        fit(model, fast.Callback("dpsgd:ring", engine=one_rank()))


# gradient strategies and DistributedOptimizer -------------------------------------------------------------------
def test_a_gradient_strategy_asks_for_the_distributed_optimizer() -> None:
    model = make_model(one_rank(), keras.optimizers.SGD(LR))
    with pytest.raises(ConfigError, match=r"'allreduce' exchanges gradients.*fast_tf.DistributedOptimizer"):
        fit(model, fast.Callback("allreduce", engine=one_rank()))


def test_the_distributed_optimizer_without_the_callback_refuses_to_train() -> None:
    model = make_model(one_rank(), fast.DistributedOptimizer(keras.optimizers.SGD(LR)))
    with pytest.raises(RuntimeError, match=r"callbacks=\[fast_tf.Callback"):
        fit(model, None)


def test_the_distributed_optimizer_wraps_one_keras_optimizer_once() -> None:
    with pytest.raises(TypeError, match="wraps a keras.optimizers.Optimizer, got str"):
        fast.DistributedOptimizer("sgd")
    with pytest.raises(TypeError, match="already a fast_tf.DistributedOptimizer"):
        fast.DistributedOptimizer(fast.DistributedOptimizer(keras.optimizers.SGD(LR)))


def _both_optimizers(engine: Engine) -> dict[str, object]:
    """One D-PSGD fit compiled with fast_tf.DistributedOptimizer, one with the plain optimizer."""
    wrapped, _ = fit_on_rank(engine, "dpsgd:ring", fast.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)))
    plain, _ = fit_on_rank(engine, "dpsgd:ring", keras.optimizers.SGD(LR, momentum=0.9))
    start = make_model(engine, keras.optimizers.SGD(LR))
    return {
        "wrapped": flat_weights(wrapped),
        "plain": flat_weights(plain),
        "start": flat_weights(start),
        "iterations": (int(wrapped.optimizer.iterations), int(plain.optimizer.iterations)),
    }


def test_one_script_compiled_with_the_distributed_optimizer_serves_a_parameter_strategy(recwarn) -> None:
    results = LocalCluster(4, timeout=180).run(_both_optimizers)
    for result in results:
        np.testing.assert_allclose(result["wrapped"], result["plain"], rtol=0, atol=1e-6)
        assert not np.allclose(result["wrapped"], result["start"])  # it trained
        steps = len(rank_data(0)[1]) // BATCH * 2  # keras_cases' two epochs
        assert result["iterations"] == (steps, steps)
    assert not np.allclose(results[0]["wrapped"], results[1]["wrapped"])  # D-PSGD's ranks differ: not a broadcast
    ours = [str(w.message) for w in recwarn if "optimizer" in str(w.message).lower()]
    assert not ours, ours


def _diloco(engine: Engine) -> np.ndarray:
    model, _ = fit_on_rank(engine, "diloco:period=2", keras.optimizers.SGD(LR))
    return flat_weights(model)


def test_diloco_through_the_string_matches_the_numpy_reference() -> None:
    results = LocalCluster(4, timeout=180).run(_diloco)
    rule = DiLoCoReference(period=2)

    def update(step: int, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        if rule.theta is None:
            rule.start(x)  # rank 0's start, on every rank
        return rule.after_step(step, x - LR * g)

    expected = simulate(4, update)
    for rank, params in enumerate(results):
        np.testing.assert_allclose(params, expected[rank], rtol=0, atol=ATOL)


def test_gradient_strategies_need_one_step_per_execution() -> None:
    model = make_model(one_rank(), fast.DistributedOptimizer(keras.optimizers.SGD(LR)))
    model.compile(
        optimizer=fast.DistributedOptimizer(keras.optimizers.SGD(LR)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=2,
    )
    with pytest.raises(ConfigError, match="steps_per_execution=1"):
        fit(model, fast.Callback("allreduce", engine=one_rank()))


def test_the_optimizer_state_is_the_wrapped_optimizers_and_saved_with_the_model(tmp_path) -> None:
    inner = keras.optimizers.SGD(LR, momentum=0.9)
    optimizer = fast.DistributedOptimizer(inner)
    model = make_model(one_rank(), optimizer)
    fit(model, fast.Callback("allreduce", engine=one_rank()))
    optimizer.learning_rate = 0.02
    assert float(inner.learning_rate) == pytest.approx(0.02)
    assert int(optimizer.iterations) == int(inner.iterations) == len(rank_data(0)[1]) // BATCH
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(loaded.optimizer, fast.DistributedOptimizer)
    assert isinstance(loaded.optimizer.optimizer, keras.optimizers.SGD)
    assert loaded.optimizer.optimizer.momentum == pytest.approx(0.9)
    for saved, restored in zip(optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(saved.numpy(), restored.numpy())


def test_reset_optimizer_zeroes_the_state_and_keeps_rate_and_iterations() -> None:
    model = make_model(one_rank(), keras.optimizers.SGD(LR, momentum=0.9))
    fit(model, None)
    adapter = fast.KerasModel(model)
    optimizer = model.optimizer
    iterations = int(optimizer.iterations)
    adapter.reset_optimizer()
    assert int(optimizer.iterations) == iterations > 0
    assert float(optimizer.learning_rate) == pytest.approx(LR)
    momenta = [v for v in optimizer.variables if "momentum" in v.name]
    assert momenta and all(not np.any(v.numpy()) for v in momenta)


# epochs and steps -----------------------------------------------------------------------------------------------
def test_an_epoch_of_unknown_length_is_refused() -> None:
    x, y = rank_data(0)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(BATCH)  # cardinality unknown
    model = make_model(one_rank(), keras.optimizers.SGD(LR))
    with pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(data, epochs=1, verbose=0, callbacks=[fast.Callback("dpsgd:ring", engine=one_rank())])


def _fit_uneven(engine, strategy: str) -> int:
    x, y = rank_data(engine.rank)
    extra = BATCH * engine.rank  # rank 1 has one more batch
    x, y = np.concatenate([x, x[:extra]]), np.concatenate([y, y[:extra]])
    model = make_model(engine, keras.optimizers.SGD(LR))
    callback = fast.Callback(strategy, engine=engine)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[callback])
    return callback.worker.step


def test_synchronous_strategies_refuse_ranks_with_different_step_counts() -> None:
    with pytest.raises(ValueError, match=r"between 4 and 5 steps per epoch.*'dpsgd' needs the same number.*shard"):
        LocalCluster(2, timeout=240).run(_fit_uneven, "dpsgd:ring")
    assert LocalCluster(2, timeout=240).run(_fit_uneven, "async:ring") == [4, 5]  # asynchronous: nobody waits


def test_a_callback_trains_again_in_a_second_fit() -> None:
    engine = one_rank()
    model = make_model(engine, fast.DistributedOptimizer(keras.optimizers.SGD(LR)))
    callback = fast.Callback("allreduce", engine=engine)
    fit(model, callback)
    first = model.get_weights()
    fit(model, callback)
    assert callback.worker.step == len(rank_data(0)[1]) // BATCH  # a fresh worker for the new fit
    assert not np.allclose(first[0], model.get_weights()[0])


# data -----------------------------------------------------------------------------------------------------------
def test_shard_splits_arrays_into_disjoint_equal_parts() -> None:
    x, y = np.arange(10) * 10, np.arange(10)
    cluster = LocalCluster(3)
    parts = [fast.shard(x, y, drop_last=True, engine=cluster.engine(r)) for r in range(3)]
    assert [len(px) for px, _ in parts] == [3, 3, 3]
    for px, py in parts:
        np.testing.assert_array_equal(px, py * 10)  # samples stay paired
    taken = np.concatenate([py for _, py in parts])
    assert len(set(taken.tolist())) == 9
    padded = [fast.shard(y, engine=cluster.engine(r)) for r in range(3)]  # the default: equal shares, padded
    assert [len(p) for p in padded] == [4, 4, 4]
    assert set(np.concatenate(padded).tolist()) == set(range(10))
    with pytest.raises(ValueError, match="different lengths"):
        fast.shard(x, y[:5], engine=cluster.engine(0))
    with pytest.raises(ValueError, match="cannot be shared by 3 ranks"):
        fast.shard(x[:2], engine=cluster.engine(0))


def test_shard_splits_a_tf_dataset() -> None:
    cluster = LocalCluster(3)
    parts = [list(fast.shard(tf.data.Dataset.range(10), drop_last=True, engine=cluster.engine(r))) for r in range(3)]
    parts = [[int(v) for v in p] for p in parts]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    padded = [[int(v) for v in fast.shard(tf.data.Dataset.range(10), engine=cluster.engine(r))] for r in range(3)]
    assert padded == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    unknown = tf.data.Dataset.range(10).filter(lambda v: True)
    assert len(list(fast.shard(unknown, engine=cluster.engine(0)))) == 4  # only sharded
