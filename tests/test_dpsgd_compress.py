"""D-PSGD with compressed parameter messages (``dpsgd:ring,compress=...``): the bytes on the wire shrink by the
codec's ratio, the models still agree and learn, and the rule is D-PSGD's with the neighbours' decoded values."""

from __future__ import annotations

import numpy as np
import pytest
from training import reference_dpsgd, task, train

from fast_core import LocalCluster, make_strategy
from fast_core.compression import make_codec

STEPS = 40


def _run(engine, strategy: str) -> tuple[np.ndarray, int, float]:
    model, worker = train(engine, strategy, STEPS)
    _, _, _, (x_test, y_test) = task(engine.size)
    accuracy = model.accuracy(x_test, y_test)
    return model.params().copy(), worker.metrics.bytes_sent, accuracy


@pytest.mark.parametrize("codec", ["bf16", "int8", "fp16"])
def test_compressed_dpsgd_follows_its_rule_and_sends_fewer_bytes(codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(_run, "dpsgd:ring")
    packed = LocalCluster(4, timeout=30).run(_run, f"dpsgd:ring,compress={codec}")
    coder = make_codec(codec)
    expected = reference_dpsgd(4, "ring", STEPS, sent=lambda x: coder.decode(coder.encode(x), len(x)))
    for rank, (params, sent, accuracy) in enumerate(packed):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-5, atol=1e-6)
        assert accuracy >= plain[rank][2] - 0.02  # it learns as plain D-PSGD does
        ratio = plain[rank][1] / sent  # float64 parameters: 4x as bf16/fp16, ~8x as int8
        assert ratio > (7.5 if codec == "int8" else 3.9), (codec, ratio)
    assert not np.allclose(packed[0][0], plain[0][0])  # the codec did change what was mixed


def test_sparsifying_codecs_are_refused_for_parameters() -> None:
    with pytest.raises(ValueError, match="sparsified parameter vector is mostly zeros"):
        make_strategy("dpsgd:ring,compress=topk")
    with pytest.raises(ValueError, match="unknown codec"):
        make_strategy("dpsgd:ring,compress=int4")
