"""``compress=`` on the asynchronous strategies' mailboxes (``async:ring,compress=int8``): the mailbox carries the
codec's bytes, the receiver mixes the decoded values (checked exactly where each rank's mixing is pinned), the
models still learn, and the bytes per message shrink by the codec's ratio."""

from __future__ import annotations

import numpy as np
import pytest
from cases_async import rank0_against_stalled_neighbours
from cases_pairs import round_trip
from mailbox_metering import assert_mailbox_frames, learn_metered, payload_bytes

from fast_core import LocalCluster, make_strategy
from fast_core.transport import framing


def _start(rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s distinct starting parameters (no codec keeps them exactly)."""
    return np.random.default_rng(rank).normal(0.0, 1.0 + rank, size)


def _rank0_mixes_decoded_neighbours(engine, codec: str, keep: bool) -> None:
    """The others send their start and stall; rank 0 adds 0.25 before each of 3 steps and mixes each neighbour's
    first message once: its parameters must be the rule with the neighbours' decoded starts, to 1e-12."""

    def rule(step, expected, own, pulls):
        if step != 0:
            return expected
        size = len(expected)
        heard = sum(w * round_trip(codec)(_start(peer, size)) for peer, w in pulls.items())
        assert not np.allclose(heard, sum(w * _start(peer, size) for peer, w in pulls.items()))  # lossy indeed
        if keep:  # x += sum_j w_j (dec(x_j) - x_sent), x_sent = rank 0's own exact start
            return expected + heard - (1 - own) * _start(0, size)
        return own * expected + heard

    strategy = make_strategy(f"async:ring,keep_progress={str(keep).lower()},compress={codec}")
    rank0_against_stalled_neighbours(engine, strategy, 3, 0.25, rule, start=_start)


@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("keep", [True, False])
def test_async_averaging_mixes_decoded_neighbour_values(codec: str, keep: bool) -> None:
    LocalCluster(4, timeout=30).run(_rank0_mixes_decoded_neighbours, codec, keep)


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_async_averaging_learns_with_fewer_bytes(codec: str) -> None:
    """Every payload message is the 16-byte header and the codec's bytes: ~3.7x (fp16) and ~6.5x (int8) fewer
    than float64 parameters for this small model, header included."""
    plain = LocalCluster(4, timeout=30).run(learn_metered, "async:torus")
    packed = LocalCluster(4, timeout=30).run(learn_metered, f"async:torus,compress={codec}")
    assert_mailbox_frames(plain, "none")
    assert_mailbox_frames(packed, codec)
    header = framing.HEADER_BYTES
    assert (header + payload_bytes("none")) / (header + payload_bytes(codec)) > (6 if codec == "int8" else 3.5)
    for (accuracy, *_), (plain_accuracy, *_) in zip(packed, plain, strict=True):
        assert accuracy >= plain_accuracy - 0.02, (codec, accuracy, plain_accuracy)


def test_async_averaging_refuses_sparsifying_codecs() -> None:
    with pytest.raises(ValueError, match="async averaging cannot send its vectors as topk"):
        make_strategy("async:ring,compress=topk")
