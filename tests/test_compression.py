"""fast_core.compression: codecs against NumPy, the bytes they save, and error feedback's bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from fast_core.compression import ErrorFeedback, make_codec

RNG = np.random.default_rng(0)
X = (RNG.standard_normal(10_000) * np.exp(RNG.uniform(-3, 3, 10_000))).astype(np.float32)


def test_half_precisions_round_to_nearest_within_their_precision() -> None:
    for spec, digits in (("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        codec = make_codec(spec)
        back = codec.decode(codec.encode(X), len(X))
        assert back.dtype == np.float32 and codec.ratio(len(X)) == 2.0
        np.testing.assert_allclose(back, X, rtol=digits, atol=1e-7 if spec == "fp16" else 0)
    bf16 = make_codec("bf16")
    reference = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, np.inf], np.float32)  # ties go to even
    back = bf16.decode(bf16.encode(reference), 5)
    np.testing.assert_array_equal(back, [1.0, 1.0, 1.0 + 4 * 2**-8, -0.0, np.inf])
    assert np.isnan(bf16.decode(bf16.encode(np.array([np.nan], np.float32)), 1)[0])


def test_int8_keeps_each_value_within_half_its_blocks_step() -> None:
    codec = make_codec("int8:block=128")
    back = codec.decode(codec.encode(X), len(X))
    blocks = np.abs(np.pad(X, (0, -len(X) % 128))).reshape(-1, 128).max(axis=1) / 127
    assert np.all(np.abs(back - X) <= np.repeat(blocks, 128)[: len(X)] / 2 + 1e-6)
    assert codec.ratio(len(X)) == pytest.approx(4 * 10_000 / (10_000 + 4 * 79))  # 3.88x: one scale per block
    odd = X[:1000]  # a last block shorter than the others
    np.testing.assert_allclose(codec.decode(codec.encode(odd), 1000), odd, atol=np.abs(odd).max() / 127)
    assert np.all(codec.decode(codec.encode(np.zeros(5, np.float32)), 5) == 0)


def test_topk_keeps_exactly_the_largest_magnitudes() -> None:
    codec = make_codec("topk:ratio=0.01")
    back = codec.decode(codec.encode(X), len(X))
    largest = np.argsort(-np.abs(X))[:100]
    np.testing.assert_array_equal(np.flatnonzero(back), np.sort(largest))
    np.testing.assert_array_equal(back[largest], X[largest])
    assert codec.ratio(len(X)) == 50.0  # 100 (index, value) pairs of 8 bytes against 40,000 bytes


def test_randomk_draws_the_same_positions_on_both_sides_and_sends_only_values() -> None:
    codec = make_codec("randomk:ratio=0.05")
    payload = codec.encode(X, seed=7)
    assert payload.nbytes == 4 * 500
    back = codec.decode(payload, len(X), seed=7)
    kept = np.flatnonzero(back)
    assert len(kept) == 500 and np.array_equal(back[kept], X[kept])
    assert not np.array_equal(codec.positions(len(X), 7), codec.positions(len(X), 8))


@pytest.mark.parametrize("spec", ["topk:ratio=0.01", "int8:block=256", "randomk:ratio=0.02", "bf16"])
def test_error_feedback_loses_nothing_for_good(spec: str) -> None:
    codec = make_codec(spec)
    feedback = ErrorFeedback(codec, len(X))
    sent = np.zeros(len(X), np.float64)
    for step in range(60):
        sent += codec.decode(feedback.encode(X, seed=step), len(X), seed=step)
    # what arrived plus what is still held back is exactly what was given (up to float32 rounding)
    np.testing.assert_allclose(sent + feedback.residual, 60 * X.astype(np.float64), rtol=1e-4, atol=1e-3)
    assert feedback.bytes_sent == 60 * codec.encode(X, seed=0).nbytes
    if spec in ("int8:block=256", "bf16"):  # a quantizer holds back less than one rounding step, whatever T
        step = np.abs(np.pad(X, (0, -len(X) % 256))).reshape(-1, 256).max(axis=1) / 127
        assert np.all(np.abs(feedback.residual) <= np.repeat(step, 256)[: len(X)])


def test_bad_specs_are_named() -> None:
    with pytest.raises(ValueError, match="unknown codec 'int4'"):
        make_codec("int4")
    with pytest.raises(ValueError, match="give block=<int> \\(int8\\) or ratio=<float>"):
        make_codec("int8:size=3")
    with pytest.raises(ValueError, match="'x' is not a int"):
        make_codec("int8:block=x")
    with pytest.raises(ValueError, match="takes no option"):
        make_codec("fp16:ratio=0.1")
    with pytest.raises(ValueError, match="ratio must be in \\(0, 1\\]"):
        make_codec("topk:ratio=2")
    with pytest.raises(ValueError, match="flat vector"):
        make_codec("fp16").encode(np.zeros((2, 2)))
