"""``fast:...,compress=`` on FAST's gradients: any codec, top-k and random-k included, with error feedback. The
synchronous form equals the NumPy rule with the decoded gradients (and each sender's residual); the bytes shrink
by the codec's ratio; the asynchronous form's mailbox carries the codec's bytes and still learns."""

from __future__ import annotations

import numpy as np
import pytest
from cases_async import reference_fast
from mailbox_metering import assert_mailbox_frames, learn_metered, payload_bytes
from training import train

from fast_core import LocalCluster, make_strategy
from fast_core.compression import make_codec
from fast_core.model.numpy_model import AdaGrad

STEPS, LR = 12, 0.05


def _sync(engine, spec: str) -> tuple[np.ndarray, int]:
    model, worker = train(engine, make_strategy(spec), STEPS, optimizer=AdaGrad(LR))
    return model.params().copy(), worker.metrics.bytes_sent


@pytest.mark.parametrize("codec", ["int8", "bf16", "topk:ratio=0.1", "randomk:ratio=0.25"])
def test_synchronous_fast_applies_decoded_gradients_with_error_feedback(codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(_sync, "fast:torus,synchronous=true")
    packed = LocalCluster(4, timeout=30).run(_sync, f"fast:torus,synchronous=true,compress={codec}")
    coder = make_codec(codec)
    expected = reference_fast(4, STEPS, LR, coder)
    ratio = payload_bytes("none") / payload_bytes(codec)  # float64 gradients against the codec's payload
    for rank, (params, sent) in enumerate(packed):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-6, atol=1e-9, err_msg=codec)
        assert plain[rank][1] / sent == pytest.approx(ratio, rel=0.01), codec
    assert not np.allclose(packed[0][0], plain[0][0])  # the codec changed what was applied


@pytest.mark.parametrize("codec", ["int8", "topk:ratio=0.1", "randomk:ratio=0.25"])
def test_asynchronous_fast_sends_codec_bytes_and_learns(codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(learn_metered, "fast:torus,restart_every=none")
    packed = LocalCluster(4, timeout=30).run(learn_metered, f"fast:torus,restart_every=none,compress={codec}")
    assert_mailbox_frames(plain, "none")
    assert_mailbox_frames(packed, codec)
    for (accuracy, *_), (plain_accuracy, *_) in zip(packed, plain, strict=True):
        # asynchronous FAST's averaged model varies by about 0.02 from run to run here (0.915-0.955 measured)
        assert accuracy >= plain_accuracy - 0.04, (codec, accuracy, plain_accuracy)


def test_fast_compress_is_in_its_repr() -> None:
    assert "compress='topk:ratio=0.01'" in repr(make_strategy("fast:torus,compress=topk:ratio=0.01"))
