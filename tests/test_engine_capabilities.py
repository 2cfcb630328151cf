"""The engine is a small core protocol plus capabilities asked for by type (issue 30): which engines have which,
wrappers that keep the capabilities of what they wrap, the communication threads' driver chosen by capability, and
transports that all take a codec the same way, below which compression sits."""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import numpy as np
import pytest

from fast_core import LocalCluster, PeerFailed
from fast_core.engine import Engine, FaultTolerant, Metered, VirtualTime
from fast_core.engine.capabilities import count_wait, fault_tolerance, joining, world_ranks
from fast_core.engine.metered import MeteredEngine, unmetered
from fast_core.metrics import Metrics
from fast_core.simulate.engine import SimCluster
from fast_core.transport import Mailbox, PullBox, PushBox, RequestService
from fast_core.transport.drivers import RealTimeDriver, VirtualTimeDriver, driver_for

CORE = {
    "isend",
    "irecv",
    "wait",
    "wait_all",
    "exchange",
    "allreduce",
    "iallreduce",
    "broadcast",
    "broadcast_text",
    "barrier",
    "ibarrier",
    "dup",
    "split",
    "free",
    "check_alive",
    "check_peer",
}
"""The core protocol's methods: messaging, collectives, new engines, and the hooks every wait uses."""
CAPABILITIES = (FaultTolerant, VirtualTime, Metered)


def _capabilities(engine: Engine) -> set[type]:
    return {c for c in CAPABILITIES if isinstance(engine, c)}


def test_the_core_protocol_holds_messaging_only_and_no_flag_on_the_engine_kind() -> None:
    attributes = {"name", "threads_supported", "thread_level"}
    assert {n for n in dir(Engine) if not n.startswith("_")} - attributes == CORE
    for flag in ("cooperative", "fault_tolerant", "shrink", "attach_pump", "record_wait"):
        assert not hasattr(Engine, flag), flag


def test_each_engine_has_the_capabilities_of_its_kind_and_a_metered_one_those_of_what_it_wraps() -> None:
    plain = LocalCluster(1, timeout=5).engine(0)
    surviving = LocalCluster(1, timeout=5, fault_tolerant=True).engine(0)
    simulated = SimCluster(1).run(lambda engine: engine)[0]
    assert _capabilities(plain) == set() and _capabilities(surviving) == {FaultTolerant}
    assert _capabilities(simulated) == {VirtualTime}
    for engine in (plain, surviving, simulated):
        metered = MeteredEngine(engine, Metrics())
        assert _capabilities(metered) == _capabilities(engine) | {Metered}
        assert unmetered(metered) is engine
    twin = MeteredEngine(surviving, Metrics()).dup()  # a dup is metered and keeps the capability
    assert _capabilities(twin) == {FaultTolerant, Metered} and twin.world_ranks == (0,)


def test_asking_for_a_capability_an_engine_lacks_has_a_plain_answer() -> None:
    engine = LocalCluster(2, timeout=5).engine(1)
    assert world_ranks(engine) == (0, 1) and joining(engine) == ()
    count_wait(engine, 1.0)  # nothing counts it, and nothing fails
    with pytest.raises(PeerFailed, match=r"rank 1: the local engine cannot go on without a lost rank.*fault-tolerant"):
        fault_tolerance(engine)
    metrics = Metrics()
    count_wait(MeteredEngine(engine, metrics), 0.5)
    assert metrics.wait_seconds == 0.5


def test_the_communication_thread_runs_on_the_time_its_engine_keeps() -> None:
    work = types.SimpleNamespace(name="probe", rank=0, idle_pause=1e-3)
    assert isinstance(driver_for(work, LocalCluster(1, timeout=5).engine(0)), RealTimeDriver)
    virtual = SimCluster(1).run(lambda engine: driver_for(work, MeteredEngine(engine, Metrics())))[0]
    assert isinstance(virtual, VirtualTimeDriver)


def _mailbox_on_virtual_time(engine: Engine) -> float:
    metered = MeteredEngine(engine, Metrics())
    peer = 1 - engine.rank
    mailbox = Mailbox(metered, [peer], [peer], 3, np.float64, name="probe")
    mailbox.post(np.full(3, float(engine.rank)), step=1)
    mailbox.wait_for(peer, 1)
    got = mailbox.take(peer)
    mailbox.close()
    return float(got.payload[0])


def test_a_mailbox_on_virtual_time_delivers_without_a_thread() -> None:
    assert SimCluster(2).run(_mailbox_on_virtual_time) == [1.0, 0.0]


def test_every_transport_takes_its_codec_as_one_keyword() -> None:
    for transport in (Mailbox, RequestService, PushBox, PullBox):
        codec = inspect.signature(transport).parameters["codec"]
        assert codec.kind is inspect.Parameter.KEYWORD_ONLY and codec.default is None, transport


def test_compression_sits_below_the_transports() -> None:
    folder = Path(__file__).resolve().parent.parent / "fast_core" / "compression"
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n.startswith("fast_core.transport") for n in names), f"{path.name} imports {names}"
