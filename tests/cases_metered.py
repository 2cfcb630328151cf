"""Multi-rank cases of the metering engine: every message, byte and wait counted once, on every path
(collected by cases.py)."""

from __future__ import annotations

import numpy as np

from fast_core.engine import Engine
from fast_core.engine.metered import MeteredEngine, unmetered
from fast_core.metrics import Metrics


def case_metering_counts_sends_at_post_and_receives_at_completion(engine: Engine) -> None:
    if engine.size == 1:
        return
    metrics = Metrics()
    metered = MeteredEngine(engine, metrics)
    right, left = (engine.rank + 1) % engine.size, (engine.rank - 1) % engine.size
    send, recv = np.arange(100, dtype=np.float64), np.empty(100, dtype=np.float64)
    receive = metered.irecv(recv, left, tag=5)
    assert metrics.bytes_received == 0  # nothing has arrived yet
    metered.wait_all([receive, metered.isend(send, right, tag=5)])
    assert (metrics.messages_sent, metrics.bytes_sent) == (1, 800)
    assert (metrics.messages_received, metrics.bytes_received) == (1, 800)
    assert receive.test() and metrics.bytes_received == 800  # counted once, however often it is tested
    assert metrics.wait_seconds > 0
    ignored = metered.irecv(np.empty(3), left, tag=6)  # never sent: cancelled, so nothing moved
    ignored.cancel()
    assert metrics.messages_received == 1
    metered.barrier()


def case_metering_counts_collectives_and_the_duplicates_of_communication_threads(engine: Engine) -> None:
    metrics = Metrics()
    metered = MeteredEngine(engine, metrics)
    buf = np.ones(1000, dtype=np.float32)
    metered.allreduce(buf)
    assert buf[0] == engine.size
    ring = int(2 * 4000 * (engine.size - 1) / engine.size)  # a ring all-reduce moves this much each way
    assert metrics.bytes_sent == metrics.bytes_received == ring
    twin = metered.dup()
    assert unmetered(twin) is not twin and unmetered(metered) is engine
    if engine.size > 1:
        right, left = (engine.rank + 1) % engine.size, (engine.rank - 1) % engine.size
        got = np.empty(10, dtype=np.int64)
        twin.wait_all([twin.irecv(got, left), twin.isend(np.arange(10), right)])
        assert metrics.bytes_sent == ring + 80 and metrics.bytes_received == ring + 80
    before = metrics.wait_seconds
    metered.record_wait(0.25)
    assert metrics.wait_seconds == before + 0.25
    twin.barrier()
