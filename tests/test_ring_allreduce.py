"""``allreduce:compress=fp16|bf16|int8``: the ring all-reduce of fast_core.compression.ring sums within the codec's
rounding, leaves every rank bit-identical, sends 2 (N - 1) / N of the buffer in the codec's bytes, and trains as
all-reduce does."""

from __future__ import annotations

import numpy as np
import pytest
from training import task, train

from fast_core import LocalCluster, make_strategy
from fast_core.compression import make_codec
from fast_core.compression.ring import ring_allreduce
from fast_core.engine.metered import MeteredEngine
from fast_core.metrics import Metrics

RELATIVE = {"fp16": 2.0**-10, "bf16": 2.0**-7, "int8": 1 / 127}  # one rounding, relative to the largest value


def _values(rank: int, length: int, dtype) -> np.ndarray:
    return np.random.default_rng(rank).normal(size=length).astype(dtype)


def _sum_in_ring(engine, codec: str, length: int, dtype) -> tuple[np.ndarray, int]:
    metered = MeteredEngine(engine, metrics := Metrics())
    buf = _values(engine.rank, length, dtype)
    ring_allreduce(metered, buf, make_codec(codec), tag=45)
    return buf, metrics.bytes_sent


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_ring_sums_within_the_codecs_rounding_and_leaves_ranks_identical(size: int, codec: str, dtype) -> None:
    length = 1003  # chunks of unequal length
    results = LocalCluster(size, timeout=30).run(_sum_in_ring, codec, length, dtype)
    exact = sum(_values(rank, length, np.float64) for rank in range(size))
    scale = max(np.abs(_values(rank, length, np.float64)).max() for rank in range(size)) * size
    for buf, sent in results:
        assert buf.dtype == dtype
        np.testing.assert_array_equal(buf, results[0][0])  # bit-identical replicas
        assert np.abs(buf - exact).max() <= size * RELATIVE[codec] * scale
        payload = len(make_codec(codec).encode(np.zeros(length, np.float32)))
        assert abs(sent - 2 * (size - 1) / size * payload) <= 2 * size * 8  # chunk rounding and scales
    assert not np.array_equal(results[0][0], exact.astype(dtype))  # the codec did round


def _train(engine, strategy: str) -> tuple[np.ndarray, float, int]:
    model, worker = train(engine, strategy, 40)
    _, _, _, (x_test, y_test) = task(engine.size)
    return model.params().copy(), model.accuracy(x_test, y_test), worker.metrics.bytes_sent


def test_compressed_allreduce_trains_as_allreduce_with_identical_workers() -> None:
    plain = LocalCluster(4, timeout=30).run(_train, "allreduce")
    packed = LocalCluster(4, timeout=30).run(_train, "allreduce:compress=fp16")
    for params, accuracy, sent in packed:
        np.testing.assert_array_equal(params, packed[0][0])
        np.testing.assert_allclose(params, plain[0][0], rtol=0, atol=1e-3)
        assert accuracy >= plain[0][1] - 0.01
        assert plain[0][2] / sent > 3.5  # float64 gradients as fp16 (the metered ring formula against real bytes)


def test_a_sparse_allreduce_is_refused() -> None:
    with pytest.raises(ValueError, match="a sum of sparse gradients is dense"):
        make_strategy("allreduce:compress=topk")
