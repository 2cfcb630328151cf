"""fast_torch's whole-job helpers send one message for all of a model's tensors and give NumPy's numbers."""

from __future__ import annotations

import numpy as np
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
    results = LocalCluster(SIZE, timeout=30).run(_run)
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
    results = LocalCluster(SIZE, timeout=30).run(_consensus_mid_training)
    floating = [name for name, value in results[0]["own"].items() if np.issubdtype(value.dtype, np.floating)]
    for result in results:
        assert result["steps"] == 5
        for name in floating:
            np.testing.assert_array_equal(result["untouched"][name], result["own"][name], err_msg=name)
            stack = np.stack([other["own"][name].astype(np.float64) for other in results])
            expected = (stack.sum(axis=0) / SIZE).astype(result["own"][name].dtype)
            np.testing.assert_array_equal(result["copy"][name], expected, err_msg=name)
            np.testing.assert_array_equal(result["averaged"][name], result["copy"][name], err_msg=name)
