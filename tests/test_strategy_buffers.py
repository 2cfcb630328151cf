"""What benchmarks/strategy_buffers.py says each strategy keeps, for the strategies whose memory issue 25 cut:
asynchronous averaging holds its mailbox's four model-sized buffers (staged, outgoing, and the neighbour's landing
and newest message) and no copy of its own; D-PSGD its send and receive buffers. A buffer more is a regression."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from strategy_buffers import buffers  # noqa: E402


@pytest.fixture()
def traced():
    tracemalloc.start(12)
    yield
    tracemalloc.stop()


@pytest.mark.parametrize(
    ("strategy", "copies", "where"),
    [("async:ring", 4.0, "transport/mailbox.py"), ("dpsgd:ring", 2.0, "strategies/dpsgd.py")],
)
def test_a_strategy_keeps_the_buffers_its_design_needs_and_no_more(traced, strategy, copies, where) -> None:
    held = buffers(strategy)
    assert sum(c for c, _ in held) == pytest.approx(copies, abs=0.01), held  # + a 16-byte header each
    assert all(where in site for _, site in held), held
