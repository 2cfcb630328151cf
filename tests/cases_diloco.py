"""Multi-rank cases of DiLoCo, streaming DiLoCo and decentralized DiLoCo against a dense NumPy simulation of all
workers (collected by cases.py: in-process on 1, 2 and 4 ranks, and under mpiexec)."""

from __future__ import annotations

import numpy as np
from diloco_reference import DiLoCoReference
from training import CLASSES, FEATURES, LR, batch, task, train

from fast_core.engine import Engine
from fast_core.model.numpy_model import SoftmaxRegression
from fast_core.topology import make_topology

STEPS = 13  # ends between two outer steps: the inner steps since the last one are checked too


def reference_diloco(size: int, **options: object) -> np.ndarray:
    """Every worker's parameters after STEPS steps of SGD(LR) from rank 0's start under DiLoCo's rule."""
    x, y, shards, _ = task(size)
    model = SoftmaxRegression(FEATURES, CLASSES, seed=0)
    states = np.tile(model.params(), (size, 1))
    rule = DiLoCoReference(**options)
    rule.start(states)
    for step in range(STEPS):
        for r in range(size):
            model.set_params(states[r])
            model.compute_gradients(*batch(x, y, shards[r], step))
            states[r] -= LR * model.grads()
        rule.after_step(step, states)
    return rule.finish(states)  # the Worker's close merges an overlapped exchange still in flight


CASES = [
    ("diloco:period=3", {"period": 3}),
    (
        "diloco:period=4,outer_lr=0.9,momentum=0.5,nesterov=false",
        {"period": 4, "outer_lr": 0.9, "momentum": 0.5, "nesterov": False},
    ),
    ("diloco:period=4,fragments=3", {"period": 4, "fragments": 3}),  # offsets 0, 1, 2: outer steps at k = 3, 2, 1
    ("diloco:ring,period=3", {"period": 3, "topology": "ring"}),
    ("diloco:exp1,period=2,fragments=2", {"period": 2, "fragments": 2, "topology": "exp1"}),  # W(r) changes
    ("diloco:ring,period=5,fragments=5", {"period": 5, "fragments": 5, "topology": "ring"}),  # 84 = 4 x 17 + 16
    # overlap: the exchange of step k merged after step k + tau; one still in flight at the end (13 steps) at close
    ("diloco:period=4,overlap=2", {"period": 4, "overlap": 2}),  # posted at 3, 7, 11: the last merged at close
    ("diloco:period=5,overlap=1,alpha=0", {"period": 5, "overlap": 1, "alpha": 0.0}),
    (
        "diloco:period=6,fragments=2,overlap=2,alpha=0.3,outer_lr=0.9,momentum=0.5,nesterov=false",
        {"period": 6, "fragments": 2, "overlap": 2, "alpha": 0.3, "outer_lr": 0.9, "momentum": 0.5, "nesterov": False},
    ),
    ("diloco:period=6,fragments=2,overlap=1,alpha=0.7", {"period": 6, "fragments": 2, "overlap": 1, "alpha": 0.7}),
]


def case_diloco_matches_the_numpy_reference(engine: Engine) -> None:
    for spec, options in CASES:
        model, _ = train(engine, spec, steps=STEPS)
        expected = reference_diloco(engine.size, **options)
        np.testing.assert_allclose(model.params(), expected[engine.rank], rtol=1e-10, atol=0, err_msg=spec)


def case_diloco_with_plain_outer_sgd_of_rate_one_is_local_sgd(engine: Engine) -> None:
    diloco, _ = train(engine, "diloco:period=3,outer_lr=1,momentum=0", steps=STEPS)
    local, _ = train(engine, "localsgd:period=3", steps=STEPS)
    # equal up to rounding: DiLoCo averages theta - x_i where local SGD averages x_i (a few ulps of |x| ~ 0.3)
    np.testing.assert_allclose(diloco.params(), local.params(), rtol=0, atol=1e-15)
    nesterov, _ = train(engine, "diloco:period=3", steps=STEPS)
    assert np.abs(nesterov.params() - local.params()).max() > 1e-3  # the outer momentum really acts


def case_diloco_sends_what_local_sgd_sends(engine: Engine) -> None:
    """One all-reduce of the parameters' size per period, in F pieces when streaming; ring: two neighbours."""
    _, local = train(engine, "localsgd:period=4", steps=12)
    for spec in ("diloco:period=4", "diloco:period=4,fragments=4", "diloco:period=4,overlap=2", "diloco:period=4,"
                 "fragments=2,overlap=1"):
        _, worker = train(engine, spec, steps=12)
        assert abs(worker.metrics.bytes_sent - local.metrics.bytes_sent) <= 12, spec  # int() of each all-reduce
    _, ring = train(engine, "diloco:ring,period=4", steps=12)
    peers = len(make_topology("ring", engine.size).out_neighbors(engine.rank))
    assert ring.metrics.bytes_sent == 3 * peers * ring.model.layout.size * 8


def case_decentralized_diloco_keeps_the_replicas_together(engine: Engine) -> None:
    """theta_i - sum_j w_ij x_j pulls each theta toward its neighbours': the replicas stay as close as under gossip
    every period (mixing the pseudo-gradients theta_j - x_j alone let them drift: consensus distance 960 here)."""
    _, diloco = train(engine, "diloco:ring,period=4", steps=150)
    _, gossip = train(engine, "dpsgd:ring,every=4", steps=150)
    apart = diloco.group.consensus_distance()  # collective: every rank asks
    gossip_apart = gossip.group.consensus_distance()
    assert apart <= gossip_apart + 1e-12, (apart, gossip_apart)
