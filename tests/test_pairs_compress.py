"""``compress=`` on the request/reply strategies (AD-PSGD, asynchronous EASGD): the service's messages are the
codec's bytes, and what the strategies guarantee still holds with decoded values: AD-PSGD's pairs keep the
average of all workers exact; asynchronous EASGD, serialised in rank order, is the sequential rule with the
centre reading each worker's decoded x and the worker the decoded z."""

from __future__ import annotations

import pytest
from cases_pairs import adpsgd_keeps_the_average, easgd_asynchronous_in_fixed_order
from mailbox_metering import payload_bytes

from fast_core import LocalCluster


@pytest.mark.parametrize("codec", ["fp16", "int8"])
def test_compressed_adpsgd_keeps_the_average_exactly(codec: str) -> None:
    for sent in LocalCluster(4, timeout=30).run(adpsgd_keeps_the_average, codec):
        for nbytes, messages in sent:  # every request and reply: the codec's bytes, nothing else
            assert messages > 10 and nbytes == messages * payload_bytes(codec), (codec, nbytes, messages)


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_compressed_asynchronous_easgd_follows_the_rule_with_decoded_values(codec: str) -> None:
    plain = LocalCluster(4, timeout=30).run(easgd_asynchronous_in_fixed_order)
    packed = LocalCluster(4, timeout=30).run(easgd_asynchronous_in_fixed_order, codec)
    ratio = payload_bytes("none") / payload_bytes(codec)
    for plain_sent, sent in zip(plain, packed, strict=True):
        assert plain_sent / sent == pytest.approx(ratio), codec  # requests and replies alike
