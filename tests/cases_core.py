"""Multi-rank cases of the engines, the Worker, all-reduce and D-PSGD (collected by cases.py).

Each ``case_*`` takes this rank's engine, runs the same code on every rank and asserts; a failure on any rank
fails the case (in-process: re-raised by LocalCluster.run; under MPI: the job aborts).
"""

from __future__ import annotations

import numpy as np
from training import CLASSES, FEATURES, reference_dpsgd, reference_mean_gradient, task, train

from fast_core import Worker
from fast_core.engine import Engine
from fast_core.errors import MessageError, ModelMismatchError, PeerTimeout
from fast_core.model.numpy_model import SoftmaxRegression

# engine ---------------------------------------------------------------------------------------------------------


def case_ring_exchange_in_order(engine: Engine) -> None:
    """Messages reach the right peer, with the right content, in the order sent per tag."""
    right, left = (engine.rank + 1) % engine.size, (engine.rank - 1) % engine.size
    if engine.size == 1:
        return
    sends = [np.full(1000, 10 * engine.rank + k, dtype=np.float32) for k in range(3)]
    recvs = [np.empty(1000, dtype=np.float32) for _ in range(3)]
    requests = [engine.irecv(buf, left, tag=7) for buf in recvs]
    requests += [engine.isend(buf, right, tag=7) for buf in sends]
    other = np.empty(4, dtype=np.float64)
    requests += [engine.irecv(other, right, tag=8), engine.isend(np.arange(4.0) + engine.rank, left, tag=8)]
    engine.wait_all(requests)
    for k, buf in enumerate(recvs):
        assert np.all(buf == 10 * left + k), (k, buf[:3])
    np.testing.assert_array_equal(other, np.arange(4.0) + right)


def case_collectives_match_numpy(engine: Engine) -> None:
    rng = [np.random.default_rng(r) for r in range(engine.size)]
    values = [g.normal(size=257) for g in rng]
    for dtype in (np.float32, np.float64, np.int64):
        cast = [(v * 100).astype(dtype) for v in values]
        for op, ref in (("sum", np.sum), ("min", np.min), ("max", np.max)):
            buf = cast[engine.rank].copy()
            engine.allreduce(buf, op=op)
            # float32 sums may be added in another order than NumPy's: allow its rounding (values are ~1e2)
            atol = 1e-3 if dtype == np.float32 else 1e-9
            np.testing.assert_allclose(buf, ref(np.stack(cast), axis=0), rtol=0, atol=atol)
    for root in range(engine.size):
        buf = np.full(33, float(engine.rank))
        engine.broadcast(buf, root=root)
        assert np.all(buf == root)
    engine.barrier()


def case_iallreduce_matches_numpy_in_any_order_of_waiting(engine: Engine) -> None:
    """Nonblocking all-reduces: each op against NumPy; two in flight at once, waited last-posted first, with a
    blocking one and one of another kind between them."""
    rng = [np.random.default_rng(10 + r) for r in range(engine.size)]
    values = [g.normal(size=301) for g in rng]
    for op, ref in (("sum", np.sum), ("min", np.min), ("max", np.max)):
        buf = values[engine.rank].copy()
        engine.wait(engine.iallreduce(buf, op=op))
        np.testing.assert_allclose(buf, ref(np.stack(values), axis=0), rtol=1e-12, atol=0, err_msg=op)
    first, second = values[engine.rank].copy(), 2.0 * values[engine.rank][:7]
    kinded = np.full(3, float(engine.rank))
    requests = [engine.iallreduce(first), engine.iallreduce(second, op="max")]
    other = engine.iallreduce(kinded, op="min", kind="parameters")
    blocking = np.ones(2)
    engine.allreduce(blocking)
    engine.wait(requests[1])
    engine.wait_all([other, requests[0]])
    np.testing.assert_allclose(first, np.sum(values, axis=0), rtol=1e-12, atol=0)
    np.testing.assert_array_equal(second, 2.0 * np.max(values, axis=0)[:7])
    np.testing.assert_array_equal(kinded, np.zeros(3))
    np.testing.assert_array_equal(blocking, np.full(2, float(engine.size)))


def case_size_mismatch_is_a_clear_error(engine: Engine) -> None:
    """A receive whose buffer does not match what the peer sent raises MessageError naming the peer."""
    if engine.size < 2:
        return
    for sent, expected in ((10, 12), (12, 10)):
        if engine.rank == 0:
            engine.wait(engine.isend(np.zeros(sent, dtype=np.float32), 1, tag=21))
        elif engine.rank == 1:
            try:
                engine.wait(engine.irecv(np.zeros(expected, dtype=np.float32), 0, tag=21))
            except MessageError as exc:
                assert "rank 0" in str(exc) and str(expected * 4) in str(exc), exc
            else:
                raise AssertionError("a mismatched message size went unnoticed")
        engine.barrier()


def case_point_to_point_timeout_names_peer(engine: Engine) -> None:
    if engine.size < 2:
        return
    if engine.rank == 0:
        request = engine.irecv(np.zeros(3), 1, tag=22)  # rank 1 never sends this
        try:
            engine.wait(request, timeout=0.3)
        except PeerTimeout as exc:
            assert exc.ranks == (1,) and "rank(s) [1]" in str(exc) and "receive of 24 bytes" in str(exc), exc
        else:
            raise AssertionError("waiting for a message never sent did not time out")
        request.cancel()
    engine.barrier()


def case_collective_timeout_names_absent_rank(engine: Engine) -> None:
    """A blocking all-reduce and a nonblocking one's wait both time out naming the rank that never joined."""
    if engine.size < 2:
        return
    absent = engine.size - 1
    for call in ("allreduce", "iallreduce"):
        side = engine.dup(timeout=0.5)
        if engine.rank != absent:
            try:
                side.allreduce(np.ones(2)) if call == "allreduce" else side.wait(side.iallreduce(np.ones(2)))
            except PeerTimeout as exc:
                assert absent in exc.ranks and f"rank(s) [{absent}]" in str(exc) and "allreduce(sum)" in str(exc), exc
            else:
                raise AssertionError(f"an {call} with an absent rank did not time out")
        engine.barrier()


def case_bad_peer_and_tag(engine: Engine) -> None:
    for bad in (engine.size, -1, engine.rank):
        try:
            engine.isend(np.zeros(1), bad)
        except ValueError as exc:
            assert f"rank {bad}" in str(exc)
        else:
            raise AssertionError(f"sending to rank {bad} was accepted")
    try:
        engine.allreduce(np.zeros(1), op="mean")
    except ValueError as exc:
        assert "mean" in str(exc)
    else:
        raise AssertionError("an unknown reduction was accepted")


# worker and strategies --------------------------------------------------------------------------------------------


def case_dpsgd_matches_dense_reference(engine: Engine) -> None:
    for topology in ("ring", "exp1", "torus"):
        model, worker = train(engine, f"dpsgd:{topology}", steps=20)
        reference = reference_dpsgd(engine.size, topology, steps=20)
        np.testing.assert_allclose(model.params(), reference[engine.rank], rtol=0, atol=1e-6)
        assert worker.metrics.steps == 20


def case_allreduce_keeps_workers_identical(engine: Engine) -> None:
    model, worker = train(engine, "allreduce", steps=20)
    lowest, highest = model.params().copy(), model.params().copy()
    engine.allreduce(lowest, op="min")
    engine.allreduce(highest, op="max")
    np.testing.assert_array_equal(lowest, highest)
    # and equal to one model trained on the mean gradient of all shards
    np.testing.assert_allclose(model.params(), reference_mean_gradient(engine.size, 20), rtol=0, atol=1e-10)
    assert worker.group.consensus_distance() < 1e-20


def case_strategies_train_to_allreduce_accuracy(engine: Engine) -> None:
    x, y, shards, (x_test, y_test) = task(engine.size)
    accuracy = {}
    for strategy in ("allreduce", "dpsgd:ring", "dpsgd:exp1", "choco:ring", "tracking:ring"):  # choco: top-10%
        model, worker = train(engine, strategy, steps=150)
        accuracy[strategy] = model.accuracy(x_test, y_test, worker.group.average_params())
    assert accuracy["allreduce"] > 0.9, accuracy
    assert min(accuracy.values()) >= accuracy["allreduce"] - 0.01, accuracy


def case_model_mismatch_names_first_difference(engine: Engine) -> None:
    if engine.size < 2:
        return
    odd = engine.size - 1
    classes = CLASSES + 1 if engine.rank == odd else CLASSES
    model = SoftmaxRegression(FEATURES, classes, seed=0)
    try:
        Worker(model, "allreduce", engine).start()
    except ModelMismatchError as exc:
        text = str(exc)
        assert f"rank {odd}" in text and "'weight'" in text, text
        assert f"({FEATURES}, {CLASSES + 1})" in text and f"({FEATURES}, {CLASSES})" in text, text
    else:
        raise AssertionError("different models on different ranks went unnoticed")
