"""``compress=`` on the parameter messages of synchronous gossip and synchronous EASGD (D-PSGD's are in
test_dpsgd_compress.py): every parameter equal to the NumPy rule with the neighbours' decoded values, fewer bytes by
the codec's ratio, and the forms that cannot compress refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from cases_gossip import reference_gossip
from cases_pairs import easgd_reference
from training import train

from fast_core import LocalCluster, make_strategy
from fast_core.compression import make_codec
from fast_core.errors import ConfigError
from fast_core.strategies import EASGD

STEPS = 12


def _run(engine, strategy) -> tuple[np.ndarray, int, np.ndarray | None]:
    strategy = make_strategy(strategy)
    model, worker = train(engine, strategy, STEPS)
    centre = strategy.center_params() if isinstance(strategy, EASGD) else None
    return model.params().copy(), worker.metrics.bytes_sent, centre


def _round_trip(codec: str):
    coder = make_codec(codec)
    return lambda x: coder.decode(coder.encode(x), len(x)).astype(np.float64)


@pytest.mark.parametrize("variant", ["pull", "push"])
@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_gossip_follows_its_rule_with_fewer_bytes(variant: str, codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(_run, f"gossip:{variant},seed=3")
    packed = LocalCluster(4, timeout=30).run(_run, f"gossip:{variant},seed=3,compress={codec}")
    expected = reference_gossip(4, variant, 3, STEPS, sent=_round_trip(codec))
    for rank, (params, sent, _) in enumerate(packed):
        np.testing.assert_allclose(params, expected[rank], rtol=1e-6, atol=1e-7)
        if plain[rank][1]:
            assert plain[rank][1] / sent > (7.5 if codec == "int8" else 3.9)  # float64 parameters
    assert any(not np.allclose(p[0], q[0]) for p, q in zip(plain, packed, strict=True))


def test_compressed_synchronous_easgd_follows_its_rule_with_fewer_bytes() -> None:
    plain = LocalCluster(4, timeout=30).run(_run, "easgd:tau=3,alpha=0.2")
    packed = LocalCluster(4, timeout=30).run(_run, "easgd:tau=3,alpha=0.2,compress=int8")
    states, z = easgd_reference(4, STEPS, 3, 0.2, order_within_round=False, sent=_round_trip("int8"))
    for rank, (params, sent, _) in enumerate(packed):
        np.testing.assert_allclose(params, states[rank], rtol=1e-6, atol=1e-7)
        assert plain[rank][1] / sent > 7.5
    np.testing.assert_allclose(packed[0][2], z, rtol=1e-6, atol=1e-7)


def test_what_cannot_compress_says_why() -> None:
    for spec in ("gossip:compress=topk", "easgd:compress=randomk", "dpsgd:compress=topk:ratio=0.1"):
        with pytest.raises(ValueError, match="sparsified parameter vector is mostly zeros.*choco"):
            make_strategy(spec)
    with pytest.raises(ConfigError, match="asynchronous gossip cannot send compress=fp16"):
        make_strategy("gossip:synchronous=false,compress=fp16")
    with pytest.raises(ConfigError, match="asynchronous EASGD cannot send compress=int8"):
        make_strategy("easgd:synchronous=false,compress=int8")
