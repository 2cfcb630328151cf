"""What the compressed-mailbox tests share: a metered training run and the exact size of every message sent."""

from __future__ import annotations

import numpy as np
from training import CLASSES, FEATURES, task, train

from fast_core.compression import make_codec
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.topology import make_topology
from fast_core.transport import framing


def learn_metered(engine, spec: str) -> tuple[float, int, int, int]:
    """(averaged model's accuracy, bytes sent, messages sent, out-neighbours on the torus) after 150 steps with
    a compute time, so that messages flow every step; bytes and messages are counted before average_params."""
    model, worker = train(engine, spec, 150, pause=0.002)
    _, _, _, (x_test, y_test) = task(engine.size)
    sent = worker.metrics.bytes_sent, worker.metrics.messages_sent
    dests = len(make_topology("torus", engine.size).out_neighbors(engine.rank))
    return model.accuracy(x_test, y_test, worker.group.average_params()), *sent, dests


def payload_bytes(codec: str) -> int:
    """The bytes of one message of the test model's parameters or gradients: the codec's, or float64's for none."""
    size = SoftmaxRegression(FEATURES, CLASSES).layout.size
    return 8 * size if codec == "none" else len(make_codec(codec).encode(np.zeros(size, np.float32)))


def assert_mailbox_frames(run: list[tuple[float, int, int, int]], codec: str) -> None:
    """Every payload message of every rank was the 16-byte header and ``codec``'s bytes, besides one 8-byte
    "finished" flag per out-neighbour; and messages did flow."""
    for _, sent, messages, dests in run:
        assert messages > 10 * dests
        assert sent == (messages - dests) * (framing.HEADER_BYTES + payload_bytes(codec)) + 8 * dests, codec
