"""The transport's seams: one message framing, the thread-support check, and the two ways to get an engine."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from training import CLASSES, FEATURES

import fast_core
import fast_core.runtime.process as runtime
from fast_core.engine import LocalCluster, LocalEngine, default_engine
from fast_core.engine.metered import MeteredEngine
from fast_core.errors import FastError, PeerTimeout
from fast_core.metrics import Metrics
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.strategies import AsyncAveraging
from fast_core.transport import Mailbox, RequestService, framing
from fast_core.transport.mailbox import INLINE_MAX_BYTES


class SerializedEngine(LocalEngine):
    """A local engine that reports what an MPI library without thread support grants."""

    threads_supported = False
    thread_level = "MPI_THREAD_SERIALIZED"


def test_framing_round_trip_reads_a_view_of_the_one_copy() -> None:
    payload = np.arange(6, dtype=np.float32).reshape(2, 3)
    slot = framing.allocate(payload.nbytes)
    assert slot.nbytes == framing.HEADER_BYTES + payload.nbytes
    assert framing.header(slot) == (0, 0) and framing.header(None) == framing.NO_MESSAGE
    framing.write(slot, payload, step=7, sequence=3)
    view, step, sequence = framing.read(slot, payload.dtype)
    assert (step, sequence) == (7, 3)
    np.testing.assert_array_equal(view, payload.reshape(-1))
    assert np.shares_memory(view, slot)  # no copy on the way out
    framing.write(slot, np.asfortranarray(payload) + 1, step=8, sequence=4)  # not C-contiguous: still one layout
    np.testing.assert_array_equal(view, (payload + 1).reshape(-1))


def test_an_asynchronous_strategy_refuses_an_engine_without_thread_support() -> None:
    cluster = LocalCluster(1, timeout=5)
    engine = SerializedEngine(cluster, 0)
    threads = threading.active_count()
    with pytest.raises(FastError, match=r"MPI_THREAD_SERIALIZED.*MPI_THREAD_MULTIPLE.*pip install mpich"):
        Mailbox(engine, [], [], 4, np.float64)
    assert threading.active_count() == threads  # refused before any thread started
    metered = MeteredEngine(engine, Metrics())
    assert not metered.threads_supported and metered.thread_level == "MPI_THREAD_SERIALIZED"
    assert MeteredEngine(cluster.engine(0), Metrics()).threads_supported


def test_a_worker_with_an_asynchronous_strategy_fails_at_start_on_every_rank() -> None:
    def body(engine: LocalEngine) -> None:
        model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
        fast_core.Worker(model, AsyncAveraging("ring"), SerializedEngine(engine.cluster, engine.rank)).start()

    with pytest.raises(FastError, match="rank [01]: async-averaging needs a communication thread"):
        LocalCluster(2, timeout=10).run(body)


def test_mailbox_wait_names_the_peer_it_waited_for() -> None:
    def body(engine: LocalEngine) -> None:
        impatient = engine.dup(timeout=0.3)  # the mailbox's waits; the trainer's barrier keeps 10 s
        mailbox = Mailbox(impatient, [1 - engine.rank], [1 - engine.rank], 2, np.float64, name="probe")
        if engine.rank == 0:
            mailbox.post(np.zeros(2), step=4)
            with pytest.raises(PeerTimeout, match=r"for rank 1 \(probe: wanted step >= 5, newest has step -1"):
                mailbox.wait_for(1, min_step=5)
        else:
            mailbox.wait_for(0, min_step=4)
        engine.barrier()  # rank 1 closes (and so stops bounding rank 0) only after rank 0's wait timed out
        mailbox.close()

    LocalCluster(2, timeout=10).run(body)


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("releases", [True, False])
def test_a_mailbox_whose_trainer_releases_holds_one_buffer_less_and_still_gets_the_newest(
    releases: bool, inline: bool
) -> None:
    """Rank 0 posts 40 messages faster than rank 1 reads; rank 1 takes (and with ``releases``, gives back) the newest
    each time: it sees them in order, ends on the last, and holds depth + 1 receive buffers instead of depth + 2.
    Alike whether the turns run on the trainer's calls (``inline``) or on a thread of their own."""

    def body(engine: LocalEngine) -> int:
        peer = 1 - engine.rank
        mailbox = Mailbox(engine, [peer], [peer], 3, np.float64, releases=releases, inline=inline, name="lean")
        assert mailbox.inline is inline
        if engine.rank == 0:
            for step in range(40):
                mailbox.post(np.full(3, float(step)), step)
                np.testing.assert_array_equal(mailbox.last_posted(), np.full(3, float(step)))
                time.sleep(5e-4)
        else:
            seen: list[int] = []
            deadline = time.monotonic() + 10
            while (not seen or seen[-1] < 39) and time.monotonic() < deadline:
                message = mailbox.take(0)
                if message is not None and message.fresh:
                    assert message.payload[0] == message.step  # the values belong to the header read with them
                    seen.append(message.step)
                if releases:
                    mailbox.release(0)
                time.sleep(2e-3)
            assert seen[-1] == 39 and seen == sorted(seen), seen
        buffers = mailbox.buffers
        engine.barrier()
        mailbox.close()
        return buffers

    held = LocalCluster(2, timeout=10).run(body)[1]
    assert held == 4 if releases else held <= 5  # staged + outgoing, landing + ready (+ the trainer's current)


def test_small_messages_run_on_the_trainers_calls_and_large_ones_on_a_thread() -> None:
    """By default a mailbox whose message fits ``INLINE_MAX_BYTES`` (what MPI sends eagerly) runs its turns on the
    trainer's calls; a larger one gets a thread that moves it while the trainer computes."""
    engine = LocalCluster(1, timeout=5).engine(0)
    values = INLINE_MAX_BYTES // 8  # the payload's bytes (the 16-byte header aside)
    small = Mailbox(engine, [], [], values, np.float64)
    large = Mailbox(engine, [], [], values + 1, np.float64)
    assert small.inline and not large.inline
    small.close()
    large.close()


def test_an_inline_reply_comes_while_the_replier_sits_in_a_blocking_collective() -> None:
    """Rank 1 asks rank 0 (inline, so answered at rank 0's calls) and rank 0 meanwhile waits in a barrier that rank 1
    enters only after the reply: the backstop thread answers within its pause, no deadlock."""

    def body(engine: LocalEngine) -> float:
        service = RequestService(engine, [1] if engine.rank == 0 else [], 1, np.float64, _double, inline=True)
        started = time.monotonic()
        if engine.rank == 1:
            service.ask(0, np.array([21.0]))
            assert service.reply()[0] == 42.0
        engine.barrier()
        waited = time.monotonic() - started
        service.close()
        return waited

    waits = LocalCluster(2, timeout=10).run(body)
    assert max(waits) < 5.0  # a deadlock would end in the engine's 10 s timeout


def _double(peer: int, request: np.ndarray, reply: np.ndarray) -> None:
    reply[:] = 2 * request


def test_init_is_the_process_wide_engine_and_default_engine_a_new_one(monkeypatch, capsys) -> None:
    monkeypatch.setattr(runtime, "_engine", None)
    for variable in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"):
        monkeypatch.delenv(variable, raising=False)
    engine = fast_core.init(timeout=7)
    assert fast_core.init() is engine and runtime.init() is engine
    assert (fast_core.rank(), fast_core.size(), engine.timeout) == (0, 1, 7)
    assert "not started by an MPI launcher" in capsys.readouterr().err
    fresh = default_engine(timeout=3)
    assert fresh is not engine and fresh.timeout == 3 and fresh.threads_supported
