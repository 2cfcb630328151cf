"""Composable message compression (issue 15): codecs from a spec string, and error feedback.

    codec = make_codec("int8:block=128")      # none, fp16, bf16, int8[:block=B], topk[:ratio=R], randomk[:ratio=R]
    payload = codec.encode(x); y = codec.decode(payload, len(x))

The parameter messages of D-PSGD, synchronous gossip and synchronous EASGD go through ``ParameterWire``
(``dpsgd:ring,compress=int8``: dense codecs only); CHOCO-SGD's compressed differences take any codec
(``choco:ring,compress=topk:ratio=0.01``). Asynchronous averaging's and FAST's mailboxes carry the codec's bytes
(``Mailbox(..., codec=)``); FAST's gradients take any codec, with error feedback; SGP's numerators a dense one, its
push-sum weight exact (``ParameterWire(exact_tail=1)``); AD-PSGD's and asynchronous EASGD's requests and replies
a dense one (``RequestService(..., codec=)``), as do asynchronous gossip's push and pull boxes
(``PushBox``/``PullBox(..., codec=)``). Every transport takes its codec that one way and makes its payload with
``wire.encoding_for``; this package imports no transport (a codec knows nothing of messages).
"""

from __future__ import annotations

from fast_core.compression.codecs import BFloat16, Codec, Float16, Int8, RandomK, TopK
from fast_core.compression.feedback import ErrorFeedback
from fast_core.compression.registry import make_codec
from fast_core.compression.wire import (
    Encoding,
    ParameterWire,
    encoding_for,
    gradient_codec,
    message_seed,
    parameter_codec,
)

__all__ = [
    "BFloat16",
    "Codec",
    "Encoding",
    "ErrorFeedback",
    "Float16",
    "Int8",
    "ParameterWire",
    "RandomK",
    "TopK",
    "encoding_for",
    "gradient_codec",
    "make_codec",
    "message_seed",
    "parameter_codec",
]
