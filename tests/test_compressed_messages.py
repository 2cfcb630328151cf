"""``compress=`` on the parameter messages of synchronous gossip and synchronous EASGD (D-PSGD's are in
test_dpsgd_compress.py): every parameter equal to the NumPy rule with the neighbours' decoded values, fewer bytes by
the codec's ratio, and the forms that cannot compress refused with the reason."""

from __future__ import annotations

import time

import numpy as np
import pytest
from cases_gossip import reference_gossip
from cases_pairs import easgd_reference, round_trip
from cases_sgp import push_sum_matrix
from mailbox_metering import payload_bytes
from training import CLASSES, FEATURES, LR, batch, task, train

from fast_core import LocalCluster, make_strategy
from fast_core.compression import make_codec
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.strategies import EASGD
from fast_core.topology import make_topology
from fast_core.transport import PullBox, PushBox, framing

STEPS = 12


def _run(engine, strategy) -> tuple[np.ndarray, int, np.ndarray | None]:
    strategy = make_strategy(strategy)
    model, worker = train(engine, strategy, STEPS)
    centre = strategy.center_params() if isinstance(strategy, EASGD) else None
    return model.params().copy(), worker.metrics.bytes_sent, centre


@pytest.mark.parametrize("variant", ["pull", "push"])
@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_gossip_follows_its_rule_with_fewer_bytes(variant: str, codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(_run, f"gossip:{variant},seed=3")
    packed = LocalCluster(4, timeout=30).run(_run, f"gossip:{variant},seed=3,compress={codec}")
    expected = reference_gossip(4, variant, 3, STEPS, sent=round_trip(codec))
    for rank, (params, sent, _) in enumerate(packed):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-6, atol=1e-7)
        if plain[rank][1]:
            assert plain[rank][1] / sent > (7.5 if codec == "int8" else 3.9)  # float64 parameters
    assert any(not np.allclose(p[0], q[0]) for p, q in zip(plain, packed, strict=True))


def test_compressed_synchronous_easgd_follows_its_rule_with_fewer_bytes() -> None:
    plain = LocalCluster(4, timeout=30).run(_run, "easgd:tau=3,alpha=0.2")
    packed = LocalCluster(4, timeout=30).run(_run, "easgd:tau=3,alpha=0.2,compress=int8")
    states, z = easgd_reference(4, STEPS, 3, 0.2, order_within_round=False, sent=round_trip("int8"))
    for rank, (params, sent, _) in enumerate(packed):
        np.testing.assert_allclose(params, states[rank], rtol=1e-6, atol=1e-7)
        assert plain[rank][1] / sent > 7.5
    np.testing.assert_allclose(packed[0][2], z, rtol=1e-6, atol=1e-7)


def test_what_cannot_compress_says_why() -> None:
    for spec in ("gossip:compress=topk", "easgd:compress=randomk", "dpsgd:compress=topk:ratio=0.1"):
        with pytest.raises(ValueError, match="sparsified parameter vector is mostly zeros.*choco"):
            make_strategy(spec)


def _sgp_reference(size: int, topology: str, codec: str) -> tuple[np.ndarray, np.ndarray]:
    """Push-sum with a codec: each rank keeps its own share p_i (x_i - lr g_i) exact and adds its in-neighbours'
    decoded shares; the weights travel exactly, w <- P w. (numerators, weights) after STEPS steps."""
    x, y, shards, _ = task(size)
    graph = make_topology(topology, size)
    numerators = np.stack([SoftmaxRegression(FEATURES, CLASSES, seed=0).params()] * size)
    weights = np.ones(size)
    probe = SoftmaxRegression(FEATURES, CLASSES)
    for step in range(STEPS):
        moved = numerators.copy()
        for r in range(size):
            probe.set_params(numerators[r] / weights[r])
            probe.compute_gradients(*batch(x, y, shards[r], step))
            moved[r] -= LR * probe.grads()
        P = push_sum_matrix(graph, step)
        shares = np.diag(P)[:, None] * moved  # p_j (x_j - lr g_j): what j keeps, and what it sends each receiver
        sent = np.stack([round_trip(codec)(s) for s in shares])
        links = (P != 0) & ~np.eye(size, dtype=bool)  # links[i, j]: j pushes to i
        numerators = shares + links.astype(np.float64) @ sent
        weights = P @ weights
    return numerators, weights


def _sgp_run(engine, spec: str) -> tuple[np.ndarray, float, int]:
    strategy = make_strategy(spec)
    _, worker = train(engine, strategy, STEPS)
    return strategy.numerator.copy(), strategy.weight, worker.metrics.bytes_sent


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_sgp_sends_the_weight_exactly_and_follows_push_sum(codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(_sgp_run, "sgp:exp1")
    packed = LocalCluster(4, timeout=30).run(_sgp_run, f"sgp:exp1,compress={codec}")
    numerators, weights = _sgp_reference(4, "exp1", codec)
    size = len(numerators[0])
    coded = len(make_codec(codec).encode(np.zeros(size, np.float32))) + 8  # the weight: one exact float64
    for rank, (numerator, weight, sent) in enumerate(packed):
        np.testing.assert_allclose(numerator, numerators[rank], rtol=1e-6, atol=1e-7)
        assert weight == pytest.approx(weights[rank], abs=1e-15)  # exact: only the numerator is rounded
        assert plain[rank][2] / sent == pytest.approx(8 * (size + 1) / coded, rel=0.01)
    assert not np.allclose(packed[0][0], plain[0][0])
    with pytest.raises(ValueError, match="sgp cannot send its vectors as topk"):
        make_strategy("sgp:exp1,compress=topk")


def _arrival(take):
    """What ``take()`` returns once it returns something (within 10 s)."""
    deadline = time.monotonic() + 10
    while not (got := take()):
        assert time.monotonic() < deadline, "nothing arrived"
        time.sleep(0.002)
    return got


def _boxes_deliver_decoded(engine, codec: str) -> None:
    """Rank 1 publishes (pull) and pushes (push) x; rank 0 reads decode(encode(x)) from both boxes."""
    x = np.random.default_rng(7).normal(size=300) * 10
    coder = make_codec(codec)
    pull, push = PullBox(engine, x * 0, 0, codec=coder), PushBox(engine, x * 0, 0, codec=coder)
    if engine.rank == 1:
        pull.publish(x, 5)
        assert push.push(x, 5, dest=0)
    engine.barrier()
    if engine.rank == 0:
        pull.fetch(1)
        reply, pushed = _arrival(pull.take), _arrival(push.take_all)
        expected = round_trip(codec)(x)
        assert not np.allclose(expected, x)
        for values, step in (reply, pushed[0][1:]):
            np.testing.assert_array_equal(values, expected)
            assert step == 5
    engine.barrier()
    pull.close()
    push.close()


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_gossip_boxes_carry_codec_bytes_and_deliver_decoded_values(codec: str) -> None:
    LocalCluster(2, timeout=30).run(_boxes_deliver_decoded, codec)


def _async_gossip(engine, spec: str) -> tuple[float, int, int]:
    model, worker = train(engine, spec, 150, pause=0.001)
    _, _, _, (x_test, y_test) = task(engine.size)
    sent = worker.metrics.bytes_sent, worker.metrics.messages_sent  # before average_params' all-reduce
    return model.accuracy(x_test, y_test, worker.group.average_params()), *sent


@pytest.mark.parametrize("variant", ["pull", "push"])
def test_compressed_asynchronous_gossip_learns_with_codec_messages(variant: str) -> None:
    """Each payload is the 16-byte header and int8's bytes, besides 8-byte notices (push: one per payload) or asks
    (pull); the averaged model learns as the uncompressed one does."""
    spec = f"gossip:{variant},synchronous=false"
    plain = LocalCluster(4, timeout=30).run(_async_gossip, spec)
    packed = LocalCluster(4, timeout=30).run(_async_gossip, f"{spec},compress=int8")
    payload = framing.HEADER_BYTES + payload_bytes("int8")
    for _, sent, messages in packed:
        if variant == "push":
            assert messages % 2 == 0 and sent == messages // 2 * (payload + 8)
        else:  # every message is an ask (8 bytes) or an answer
            assert (sent - 8 * messages) % (payload - 8) == 0 and sent > 8 * messages
    for (accuracy, *_), (plain_accuracy, *_) in zip(packed, plain, strict=True):
        assert accuracy >= plain_accuracy - 0.02, (variant, accuracy, plain_accuracy)
