"""fast_core.pipeline.Channel: arrays between neighbouring stages arrive in order, bit-exact, checked against their
step; ``depth`` bounds how far a sender runs ahead; a silent peer is named within the timeout."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from mpirun import TESTS, run_mpi

from fast_core import LocalCluster
from fast_core.errors import MessageError, PeerTimeout
from fast_core.pipeline import Channel, PipelineTag

SHAPES = [(4,), (2, 3), (3, 2, 2), (), (0,), (5, 1), (1, 1, 1, 2)]
STEPS = len(SHAPES)


def inputs(dtype: type) -> list[np.ndarray]:
    """Stage 0's activations: a new shape every step, values whose low bits matter."""
    rng = np.random.default_rng(7)
    return [rng.normal(size=shape).astype(dtype) / 3 for shape in SHAPES]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_ranks_arrays_of_every_shape_arrive_in_order_and_bit_exact(dtype: type) -> None:
    def body(engine) -> list[np.ndarray] | None:
        channel = Channel(engine, 1 - engine.rank, PipelineTag.ACTIVATIONS)
        if engine.rank == 0:
            for step, array in enumerate(inputs(dtype)):
                channel.send(array, step)
            channel.close()
            return None
        return [channel.recv(step) for step in range(STEPS)]

    received = LocalCluster(2, timeout=30).run(body)[1]
    for got, sent in zip(received, inputs(dtype), strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert got.tobytes() == sent.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_chain_of_three_stages_forward_and_back_with_delayed_errors_matches_numpy(dtype: type) -> None:
    """Stage 0 reads the error of step t - 2 after sending step t's activations, stage 1 that of t - 1: the
    decoupled schedule, each stage running ahead of the errors it waits for."""

    def stage0(engine) -> list[np.ndarray]:
        forward, backward = Channel(engine, 1, PipelineTag.ACTIVATIONS), Channel(engine, 1, PipelineTag.ERRORS)
        errors = []
        for step, x in enumerate(inputs(dtype)):
            forward.send(x, step)
            if step >= 2:
                errors.append(backward.recv(step - 2))
        errors += [backward.recv(step) for step in (STEPS - 2, STEPS - 1)]
        forward.close()
        return errors

    def stage1(engine) -> None:
        back_in, back_out = Channel(engine, 2, PipelineTag.ERRORS), Channel(engine, 0, PipelineTag.ERRORS)
        forward_in = Channel(engine, 0, PipelineTag.ACTIVATIONS)
        forward_out = Channel(engine, 2, PipelineTag.ACTIVATIONS)
        for step in range(STEPS):
            forward_out.send(forward_in.recv(step) * 2 + 1, step)
            if step >= 1:
                back_out.send(back_in.recv(step - 1) * 3, step - 1)
        back_out.send(back_in.recv(STEPS - 1) * 3, STEPS - 1)
        forward_out.close()
        back_out.close()

    def stage2(engine) -> None:
        forward, backward = Channel(engine, 1, PipelineTag.ACTIVATIONS), Channel(engine, 1, PipelineTag.ERRORS)
        for step in range(STEPS):
            backward.send(forward.recv(step) - 1, step)
        backward.close()

    stages = (stage0, stage1, stage2)
    errors = LocalCluster(3, timeout=30).run(lambda engine: stages[engine.rank](engine))[0]
    for got, x in zip(errors, inputs(dtype), strict=True):
        expected = ((x * 2 + 1) - 1) * 3
        assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_sender_runs_at_most_depth_arrays_ahead_of_a_receiver_that_does_not_receive(depth: int) -> None:
    """The receiver starts receiving only after 0.5 s: the sender's first ``depth`` sends return at once, the next
    only once the receiver took an array; ``unreceived`` never exceeds ``depth``."""
    times: dict[str, float] = {}

    def body(engine) -> list[tuple[float, int]] | None:
        channel = Channel(engine, 1 - engine.rank, PipelineTag.ACTIVATIONS, depth=depth)
        if engine.rank == 1:
            time.sleep(0.5)
            times["first receive"] = time.monotonic()
            for step in range(depth + 2):
                assert channel.recv(step)[0] == step
            return None
        sent = []
        for step in range(depth + 2):
            channel.send(np.full(3, step, dtype=np.float32), step)
            sent.append((time.monotonic(), channel.unreceived))
        channel.close()
        return sent

    start = time.monotonic()
    sent = LocalCluster(2, timeout=30).run(body)[0]
    assert all(unreceived <= depth for _, unreceived in sent), sent
    assert all(done - start < 0.4 for done, _ in sent[:depth]), [done - start for done, _ in sent]
    assert sent[depth][0] >= times["first receive"]


def test_a_sender_facing_a_receiver_that_never_receives_names_it_within_the_timeout() -> None:
    def body(engine) -> tuple[str, tuple[int, ...], float] | None:
        if engine.rank == 1:
            return None
        channel = Channel(engine, 1, PipelineTag.ACTIVATIONS, timeout=1)
        start = time.monotonic()
        with pytest.raises(PeerTimeout) as caught:
            for step in range(5):
                channel.send(np.zeros(2), step)
        return str(caught.value), caught.value.ranks, time.monotonic() - start

    text, ranks, seconds = LocalCluster(2, timeout=30).run(body)[0]
    assert ranks == (1,) and "send step 2 to rank 1" in text and "received 0 of the 2" in text, text
    assert 0.9 < seconds < 5


def test_a_silent_peer_is_named_with_the_step_awaited_and_a_retry_receives_what_comes_later() -> None:
    spoke = threading.Event()

    def body(engine) -> tuple[str, tuple[int, ...], float, float] | None:
        channel = Channel(engine, 1 - engine.rank, PipelineTag.ERRORS, timeout=1)
        if engine.rank == 0:
            spoke.wait(10)
            channel.send(np.array([4.5]), 0)
            channel.close()
            return None
        start = time.monotonic()
        with pytest.raises(PeerTimeout) as caught:
            channel.recv(0)
        seconds = time.monotonic() - start
        spoke.set()
        return str(caught.value), caught.value.ranks, seconds, float(channel.recv(0)[0])

    text, ranks, seconds, late = LocalCluster(2, timeout=30).run(body)[1]
    assert ranks == (0,) and "for step 0 from rank 0" in text, text
    assert 0.9 < seconds < 5
    assert late == 4.5


def test_an_array_of_another_step_or_shape_than_asked_raises_and_the_channel_stays_in_order() -> None:
    def body(engine) -> list[str] | None:
        channel = Channel(engine, 1 - engine.rank, PipelineTag.ACTIVATIONS, depth=4)
        if engine.rank == 0:
            for step, array in ((3, np.ones(4)), (4, np.ones(4)), (5, np.arange(4.0))):
                channel.send(array, step)
            channel.close()
            return None
        errors = []
        for step, shape in ((2, None), (4, (2, 2))):
            with pytest.raises(MessageError) as caught:
                channel.recv(step, shape)
            errors.append(str(caught.value))
        assert np.array_equal(channel.recv(5, (4,)), np.arange(4.0))
        return errors

    wrong_step, wrong_shape = LocalCluster(2, timeout=30).run(body)[1]
    assert "expected the array of step 2 but received that of step 3" in wrong_step
    assert "expected shape (2, 2) but received (4,)" in wrong_shape


def test_a_declared_dtype_is_enforced_and_unsupported_arrays_are_refused_before_sending() -> None:
    engine = LocalCluster(2, timeout=5).engine(0)
    typed = Channel(engine, 1, PipelineTag.ACTIVATIONS, dtype=np.float32)
    with pytest.raises(ValueError, match="carries float32 arrays, got float64"):
        typed.send(np.zeros(3), 0)
    plain = Channel(engine, 1, PipelineTag.ERRORS)
    with pytest.raises(ValueError, match="complex128"):
        plain.send(np.zeros(3, dtype=complex), 0)
    with pytest.raises(ValueError, match="at most 8 dimensions"):
        plain.send(np.zeros((1,) * 9), 0)
    assert plain.sent == 0


@pytest.mark.parametrize(
    ("peer", "tag", "depth", "match"),
    [
        (1, 29999, 2, "tags 29999 and 30000"),
        (1, -1, 2, "0..29998"),
        (1, 60, 0, "depth=0"),
        (0, 60, 2, "cannot message itself"),
        (2, 60, 2, "rank 2"),
    ],
)
def test_a_channel_with_a_bad_tag_depth_or_peer_is_refused(peer: int, tag: int, depth: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Channel(LocalCluster(2, timeout=5).engine(0), peer, tag, depth=depth)


def test_close_waits_until_the_peer_received_everything_and_names_a_peer_that_never_does() -> None:
    def body(engine) -> tuple[float, str] | float | None:
        if engine.rank == 2:
            return None
        channel = Channel(engine, 1 - engine.rank, PipelineTag.ACTIVATIONS, timeout=1)
        if engine.rank == 1:
            time.sleep(0.5)
            channel.recv(0)
            return time.monotonic()
        channel.send(np.zeros(1), 0)
        channel.close()
        closed = time.monotonic()
        silent = Channel(engine, 2, PipelineTag.ACTIVATIONS, timeout=1)
        silent.send(np.zeros(1), 7)
        with pytest.raises(PeerTimeout) as caught:
            silent.close()
        assert caught.value.ranks == (2,)
        return closed, str(caught.value)

    (closed, text), received, _ = LocalCluster(3, timeout=30).run(body)
    assert closed >= received
    assert "to close after sending step 7 to rank 2" in text and "received 0 of the 1" in text, text


def test_a_closed_channel_refuses_to_send_or_receive() -> None:
    channel = Channel(LocalCluster(2, timeout=5).engine(0), 1, PipelineTag.ACTIVATIONS)
    with channel:
        pass
    with pytest.raises(ValueError, match="is closed"):
        channel.send(np.zeros(1), 1)
    with pytest.raises(ValueError, match="is closed"):
        channel.recv(0)


@pytest.mark.mpi
def test_two_replicas_of_a_two_stage_pipeline_under_mpi() -> None:
    out = run_mpi(4, TESTS / "pipeline_mpi.py", timeout=120)
    for check in ("groups", "chain", "depth", "silence"):
        assert f"{check} ok" in out, out
