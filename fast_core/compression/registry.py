"""Codecs by spec string: "fp16", "int8:block=64", "topk:ratio=0.01", in the grammar strategy strings use
(fast_core.grammar), so a codec spec nests in a strategy's ``compress=`` option as it is."""

from __future__ import annotations

from fast_core.compression.codecs import BFloat16, Codec, Float16, Int8, RandomK, TopK
from fast_core.grammar import parse_spec

_CODECS = {"none": Codec, "fp16": Float16, "bf16": BFloat16, "int8": Int8, "topk": TopK, "randomk": RandomK}
_OPTIONS = {"block": ("block", int), "ratio": ("ratio_kept", float)}


def make_codec(spec: str) -> Codec:
    """A codec from its spec, e.g. ``"fp16"``, ``"int8:block=64"``, ``"topk:ratio=0.01"``."""
    parsed = parse_spec(spec)
    if parsed.name not in _CODECS:
        raise ValueError(f"unknown codec {parsed.name!r} in {spec!r}: choose one of {', '.join(_CODECS)}")
    options = {}
    for key, value in parsed.items:
        item = value if key is None else f"{key}={value}"
        if key not in _OPTIONS or not value:
            raise ValueError(f"codec option {item!r} in {spec!r}: give block=<int> (int8) or ratio=<float> (topk)")
        field, kind = _OPTIONS[key]
        try:
            options[field] = kind(value)  # from the text: block=1.5 is no whole number
        except ValueError:
            raise ValueError(f"codec option {item!r} in {spec!r}: {value!r} is not a {kind.__name__}") from None
    try:
        return _CODECS[parsed.name](**options)
    except TypeError:
        raise ValueError(f"codec {parsed.name!r} takes no option {', '.join(options)} ({spec!r})") from None
