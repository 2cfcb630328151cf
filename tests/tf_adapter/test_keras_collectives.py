"""fast_tf.average/sum/broadcast: a metric or any Keras tensors, NumPy arrays and numbers over all ranks, against
NumPy, each value back in its own type, dtype and shape; in-process on a LocalCluster with the TensorFlow backend."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import fast_tf as fast
from fast_core import Engine, LocalCluster

SIZE = 4


def _metrics(rank: int) -> dict[str, object]:
    """What a script reduces: a float32 loss and an int64 count as Keras tensors, a float16 tensor, a float32 NumPy
    scalar, an int64 NumPy array, a Python float and int, a tuple, and a variable."""
    return {
        "loss": keras.ops.convert_to_tensor(0.5 + rank, dtype="float32"),
        "correct": keras.ops.convert_to_tensor(10 * rank + 3, dtype="int64"),
        "half": keras.ops.convert_to_tensor(np.arange(4) * (rank + 1), dtype="float16"),
        "scalar": np.float32(0.25 * rank),
        "counts": np.array([rank, 2 * rank], dtype=np.int64),
        "seconds": 1.25 * rank,
        "pair": (rank, np.full((2, 3), float(rank), dtype=np.float64)),
        "kernel": keras.Variable(np.full((3, 2), rank + 0.5, dtype=np.float32)),
    }


FLOATING = ("loss", "half", "scalar", "seconds", "kernel")


def _reduce(engine: Engine) -> dict[str, object]:
    mine = _metrics(engine.rank)
    return {
        "average": fast.average({key: mine[key] for key in FLOATING}, engine=engine),
        "sum": fast.sum(mine, engine=engine),
        "broadcast": fast.broadcast(mine, root=2, engine=engine),
        "plain": fast.average([keras.ops.convert_to_tensor([float(engine.rank)]), 3], engine=engine),
        "kernel": numpy(mine["kernel"]),
    }


def numpy(value: object) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.copy(value) if isinstance(value, keras.Variable) else value))


def dtype(value: object) -> str:
    return keras.backend.standardize_dtype(value.dtype)


def test_tensor_collectives_match_numpy_in_each_values_own_type_dtype_and_structure() -> None:
    results = LocalCluster(SIZE, timeout=180).run(_reduce)
    every = [_metrics(rank) for rank in range(SIZE)]
    stacks = {key: np.stack([numpy(m[key]).astype(np.float64) for m in every]) for key in every[0] if key != "pair"}
    for result in results:
        average, total, root = result["average"], result["sum"], result["broadcast"]
        assert list(average) == list(FLOATING) and list(total) == list(every[0])  # the caller's key order
        for key in ("loss", "half", "kernel"):  # Keras tensors (the variable comes back as a tensor)
            assert keras.ops.is_tensor(average[key]) and not isinstance(average[key], keras.Variable), key
            assert dtype(average[key]) == dtype(every[0][key]), key
            # float64 sums of four such numbers are exact, so the order of summation cannot matter
            expected = (stacks[key].sum(axis=0) / SIZE).astype(dtype(every[0][key]))
            np.testing.assert_array_equal(numpy(average[key]), expected, err_msg=key)
        np.testing.assert_array_equal(numpy(average["half"]), np.array([0.0, 2.5, 5.0, 7.5], dtype=np.float16))
        assert isinstance(average["scalar"], np.float32) and average["scalar"] == np.float32(0.375)
        assert isinstance(average["seconds"], float) and average["seconds"] == pytest.approx(1.875)
        assert dtype(total["correct"]) == dtype(every[0]["correct"])  # int64; int32 on JAX without x64
        assert int(numpy(total["correct"])) == 3 + 13 + 23 + 33
        assert total["counts"].dtype == np.int64 and total["counts"].tolist() == [6, 12]
        assert isinstance(total["pair"], tuple) and total["pair"][0] == 6 and isinstance(total["pair"][0], int)
        np.testing.assert_array_equal(total["pair"][1], np.full((2, 3), 6.0))
        np.testing.assert_array_equal(numpy(total["half"]), stacks["half"].sum(axis=0).astype(np.float16))
        for key, value in every[2].items():  # bit for bit, in each value's own type
            if key == "pair":
                assert root[key][0] == 2 and np.array_equal(root[key][1], value[1])
                continue
            assert type(root[key]) is type(value) or keras.ops.is_tensor(root[key]), key
            assert numpy(root[key]).dtype == numpy(value).dtype and np.array_equal(numpy(root[key]), numpy(value)), key
        assert numpy(result["plain"][0]).tolist() == [1.5] and result["plain"][1] == 3.0
        assert isinstance(result["plain"][1], float)  # an int averages to a float
    for rank, result in enumerate(results):  # each rank's variable is left as it was
        np.testing.assert_array_equal(result["kernel"], numpy(every[rank]["kernel"]))


MISMATCHES = {  # what rank 1 passes differently from the others
    "shape": lambda rank: {"x": keras.ops.zeros((3 + (rank == 1),)), "y": 1.0},
    "dtype": lambda rank: {"x": keras.ops.zeros((3,), dtype="float16" if rank == 1 else "float32"), "y": 1.0},
    "count": lambda rank: {"x": keras.ops.zeros((3,)), "y": 1.0, **({"z": 2.0} if rank == 1 else {})},
}


@pytest.mark.parametrize("collective", [fast.average, fast.sum, fast.broadcast])
@pytest.mark.parametrize("mismatch", list(MISMATCHES))
def test_ranks_passing_different_structures_all_get_an_error_instead_of_a_hang(collective, mismatch: str) -> None:
    def rank(engine: Engine) -> None:
        with pytest.raises(ValueError, match="every rank must call the collective with the same structure"):
            collective(MISMATCHES[mismatch](engine.rank), engine=engine)

    LocalCluster(SIZE, timeout=180).run(rank)


def _bad_inputs(engine: Engine) -> None:
    with pytest.raises(TypeError, match=r"average\(\) got a tensor of int32.*use fast_tf.sum\(\)"):
        fast.average(keras.ops.convert_to_tensor([1, 2], dtype="int32"), engine=engine)
    with pytest.raises(TypeError, match=r"average\(\) got an? array of int64.*use fast_tf.sum\(\)"):
        fast.average({"loss": 0.5, "count": np.array([3], dtype=np.int64)}, engine=engine)
    with pytest.raises(TypeError, match="cannot reduce a str"):
        fast.sum({"name": "loss"}, engine=engine)
    with pytest.raises(TypeError, match="cannot reduce a bool"):
        fast.sum([True], engine=engine)
    with pytest.raises(ValueError, match="is not a rank"):
        fast.broadcast(np.zeros(1), root=5, engine=engine)


def test_bad_input_is_named() -> None:
    LocalCluster(2, timeout=240).run(_bad_inputs)
