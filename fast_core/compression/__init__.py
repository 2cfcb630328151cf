"""Composable message compression (issue 15): codecs from a spec string, and error feedback.

    codec = make_codec("int8:block=128")      # none, fp16, bf16, int8[:block=B], topk[:ratio=R], randomk[:ratio=R]
    payload = codec.encode(x); y = codec.decode(payload, len(x))

The parameter messages of D-PSGD, synchronous gossip and synchronous EASGD go through ``ParameterWire``
(``dpsgd:ring,compress=int8``: dense codecs only); CHOCO-SGD's compressed differences take any codec
(``choco:ring,compress=topk:ratio=0.01``).
"""

from __future__ import annotations

from .codecs import BFloat16, Codec, Float16, Int8, RandomK, TopK
from .feedback import ErrorFeedback
from .registry import make_codec
from .wire import ParameterWire, parameter_codec

__all__ = [
    "BFloat16",
    "Codec",
    "ErrorFeedback",
    "Float16",
    "Int8",
    "ParameterWire",
    "RandomK",
    "TopK",
    "make_codec",
    "parameter_codec",
]
