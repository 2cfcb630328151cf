"""fast_torch's whole-job helpers send one message for all of a model's tensors and give NumPy's numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fast_torch as fast
from fast_core import Engine, LocalCluster

SIZE = 3


class CountingEngine:
    """An engine that records each collective (kind, dtype, length) and passes everything on to ``inner``."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.calls: list[tuple[str, np.dtype, int]] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        self.calls.append(("allreduce", buf.dtype, buf.size))
        self.inner.allreduce(buf, op, kind)

    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        self.calls.append(("broadcast", buf.dtype, buf.size))
        self.inner.broadcast(buf, root, kind)


def make_model(seed: int) -> torch.nn.Module:
    """Float32 parameters, BatchNorm buffers (float32 statistics, an int64 counter) and a float64 buffer, all holding
    float32 numbers."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    model.register_buffer("scale", torch.zeros(2, dtype=torch.float64))
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.dtype.is_floating_point:
                tensor.copy_(torch.from_numpy(rng.normal(size=tuple(tensor.shape)).astype(np.float32)))
    model[1].num_batches_tracked.fill_(seed)
    return model


def tensors(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: t.detach().numpy().copy() for name, t in model.state_dict(keep_vars=True).items()}


def _run(engine: Engine) -> dict[str, object]:
    counting = CountingEngine(engine)
    model = make_model(seed=engine.rank)
    fast.average_model(model, engine=counting)
    averaged, average_calls = tensors(model), list(counting.calls)
    counting.calls.clear()
    model = make_model(seed=engine.rank)
    fast.broadcast_parameters(model, root=1, engine=counting)
    return {"averaged": averaged, "average_calls": average_calls, "broadcast": tensors(model), "calls": counting.calls}


def test_average_and_broadcast_are_one_collective_for_all_tensors_with_numpy_results() -> None:
    results = LocalCluster(SIZE, timeout=120).run(_run)
    starts = [tensors(make_model(seed=rank)) for rank in range(SIZE)]
    floating = [name for name, value in starts[0].items() if np.issubdtype(value.dtype, np.floating)]
    count = sum(starts[0][name].size for name in floating)
    for result in results:
        assert result["average_calls"] == [("allreduce", np.dtype(np.float64), count)]  # one message, summed in f64
        assert result["calls"] == [("broadcast", np.dtype(np.uint8), sum(starts[0][n].nbytes for n in floating))]
        for name in floating:
            stack = np.stack([start[name].astype(np.float64) for start in starts])
            # float64 sums of three float32 numbers are exact, so the order of summation cannot matter
            expected = (stack.sum(axis=0) / SIZE).astype(starts[0][name].dtype)
            assert result["averaged"][name].dtype == expected.dtype
            np.testing.assert_array_equal(result["averaged"][name], expected, err_msg=name)
            np.testing.assert_array_equal(result["broadcast"][name], starts[1][name], err_msg=name)  # bit-exact
        counter = "1.num_batches_tracked"
        assert result["averaged"][counter] == result["broadcast"][counter]  # integers stay each rank's own


def _consensus_mid_training(engine: Engine) -> dict[str, object]:
    """A wrapped model under an asynchronous strategy, a few steps, then the consensus copy and an average that
    leaves the worker running; training goes on after both."""
    model = make_model(seed=engine.rank)
    opt = fast.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "async:ring", engine=engine)
    x = torch.from_numpy(np.random.default_rng(engine.rank).normal(size=(8, 4)).astype(np.float32))

    def steps(count: int) -> None:
        for _ in range(count):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    steps(3)
    own = tensors(model)
    copy = fast.consensus_copy(model)
    untouched = tensors(model)
    fast.average_model(model, close=False)
    averaged = tensors(model)
    steps(2)  # the worker still trains
    worker = opt.fast_worker
    fast.average_model(model)  # the end: closes, then averages
    return {"own": own, "copy": tensors(copy), "untouched": untouched, "averaged": averaged, "steps": worker.step}


def test_the_consensus_copy_and_a_mid_training_average_leave_the_worker_running() -> None:
    results = LocalCluster(SIZE, timeout=120).run(_consensus_mid_training)
    floating = [name for name, value in results[0]["own"].items() if np.issubdtype(value.dtype, np.floating)]
    for result in results:
        assert result["steps"] == 5
        for name in floating:
            np.testing.assert_array_equal(result["untouched"][name], result["own"][name], err_msg=name)
            stack = np.stack([other["own"][name].astype(np.float64) for other in results])
            expected = (stack.sum(axis=0) / SIZE).astype(result["own"][name].dtype)
            np.testing.assert_array_equal(result["copy"][name], expected, err_msg=name)
            np.testing.assert_array_equal(result["averaged"][name], result["copy"][name], err_msg=name)


def _metrics(rank: int) -> dict[str, object]:
    """What a script reduces: a float32 loss, an int64 count, a bfloat16 vector, a Python float and int, a list."""
    return {
        "loss": torch.tensor(0.5 + rank, dtype=torch.float32),
        "correct": torch.tensor(10 * rank + 3, dtype=torch.int64),
        "vector": torch.arange(4, dtype=torch.bfloat16) * (rank + 1),
        "seconds": 1.25 * rank,
        "pair": [rank, torch.full((2, 2), float(rank), dtype=torch.float64)],
    }


def _reduce_metrics(engine: Engine) -> dict[str, object]:
    mine = _metrics(engine.rank)
    floating = {key: mine[key] for key in ("loss", "vector", "seconds")}
    return {
        "average": fast.average(floating, engine=engine),
        "sum": fast.sum(mine, engine=engine),
        "broadcast": fast.broadcast(mine, root=2, engine=engine),
        "plain": fast.average(torch.tensor([float(engine.rank)]), engine=engine),
    }


def test_tensor_collectives_match_numpy_in_each_tensors_own_dtype_and_structure() -> None:
    results = LocalCluster(SIZE, timeout=120).run(_reduce_metrics)
    every = [_metrics(rank) for rank in range(SIZE)]
    for result in results:
        average, total, root = result["average"], result["sum"], result["broadcast"]
        assert average["loss"].dtype == torch.float32
        assert average["loss"].item() == pytest.approx(np.mean([0.5 + r for r in range(SIZE)]))
        assert average["vector"].dtype == torch.bfloat16
        expected = np.mean([np.arange(4) * (r + 1) for r in range(SIZE)], axis=0)
        np.testing.assert_allclose(average["vector"].float().numpy(), expected, rtol=1e-2)
        assert isinstance(average["seconds"], float) and average["seconds"] == pytest.approx(1.25)
        assert total["correct"].dtype == torch.int64 and total["correct"].item() == sum(10 * r + 3 for r in range(SIZE))
        assert total["pair"][0] == sum(range(SIZE)) and isinstance(total["pair"][0], int)
        np.testing.assert_array_equal(total["pair"][1].numpy(), np.full((2, 2), float(sum(range(SIZE)))))
        assert list(total) == list(every[0])  # the caller's key order is kept
        for key in ("loss", "correct", "vector"):
            assert root[key].dtype == every[2][key].dtype and torch.equal(root[key], every[2][key])
        assert root["seconds"] == every[2]["seconds"] and root["pair"][0] == 2
        assert result["plain"].tolist() == [pytest.approx(np.mean(range(SIZE)))]


def _mismatched(engine: Engine) -> str:
    try:
        fast.sum(torch.zeros(3 + (engine.rank == 1)), engine=engine)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_ranks_passing_different_shapes_all_get_an_error_instead_of_a_hang() -> None:
    messages = LocalCluster(SIZE, timeout=120).run(_mismatched)
    assert all("every rank must call the collective with the same structure" in m for m in messages), messages


def _bad_inputs(engine: Engine) -> None:
    with pytest.raises(TypeError, match="use fast_torch.sum"):
        fast.average(torch.tensor([1, 2]), engine=engine)
    with pytest.raises(TypeError, match="cannot reduce a str"):
        fast.sum({"name": "loss"}, engine=engine)
    with pytest.raises(ValueError, match="is not a rank"):
        fast.broadcast(torch.zeros(1), root=5, engine=engine)


def test_bad_input_is_named() -> None:
    LocalCluster(2, timeout=120).run(_bad_inputs)
