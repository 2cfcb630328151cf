"""One spec string: ``name[:item,item,...]``, an item ``key=value`` or a bare value.

A value runs to the next comma outside parentheses, so it may hold ``:`` and ``=``: ``compress=topk:ratio=0.01``
nests a codec spec in a strategy spec. Parentheses let a nested value hold commas as well:
``compress=(topk:ratio=0.01,seed=3)``. Spaces around names, keys, values and commas do not count; names are read
in lower case. What a bare item means is the owner's choice (a strategy's topology, gossip's variant).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fast_core.errors import ConfigError

Item = tuple[str | None, str]
"""(key, or None for a bare item; the value's text as written, outer parentheses removed)."""
Value = bool | int | float | str | None
"""What a value's text means: ``true``/``false``, ``none``, ``inf``, a whole number, a number, else the text (a
nested spec in its canonical spelling)."""


@dataclass(frozen=True)
class Spec:
    """A spec string as the grammar reads it: a name and its items in the order written."""

    name: str
    items: tuple[Item, ...] = ()


def parse_spec(text: str) -> Spec:
    """Read ``text``; a parenthesis left open or closed twice is a ConfigError naming the spec."""
    name, _, rest = text.strip().partition(":")
    items: list[Item] = []
    for part in split_top_level(rest, text):
        key, eq, value = part.partition("=")
        if "(" in key or ":" in key:  # a bare item that holds "=" further in: "(a=1,b)", "topk:ratio=0.1"
            eq = ""
        items.append((key.strip(), unwrap(value.strip())) if eq else (None, unwrap(part)))
    return Spec(name.strip().lower(), tuple(items))


def split_top_level(text: str, whole: str | None = None) -> list[str]:
    """``text`` cut at the commas outside parentheses, each piece stripped, empty pieces left out."""
    pieces, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"'{whole or text}' closes a parenthesis it never opened; write e.g. key=(a:b=1,c=2)")
        elif char == "," and depth == 0:
            pieces.append(text[start:index])
            start = index + 1
    if depth:
        raise ConfigError(f"'{whole or text}' leaves a parenthesis open; close it, e.g. key=(a:b=1,c=2)")
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]


def unwrap(value: str) -> str:
    """``(a:b=1,c=2)`` -> ``a:b=1,c=2``: the parentheses that enclose a whole value only group it."""
    value = value.strip()
    while value.startswith("(") and value.endswith(")") and _closes_at_end(value):
        value = value[1:-1].strip()
    return value


def _closes_at_end(value: str) -> bool:
    depth = 0
    for index, char in enumerate(value):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return index == len(value) - 1
    return False


def format_spec(name: str, items: Iterable[Item]) -> str:
    """The text of a spec: ``name:key=value,...``; a value holding a comma is put in parentheses."""
    parts = [f"{key}={_grouped(value)}" if key is not None else _grouped(value) for key, value in items]
    return f"{name}:{','.join(parts)}" if parts else name


def _grouped(value: str) -> str:
    return f"({value})" if len(split_top_level(value)) > 1 else value


def typed(text: str) -> Value:
    """A value's meaning: booleans, none, inf, numbers; a nested spec (``topk:ratio=1e-2``) in its canonical
    spelling (``topk:ratio=0.01``); any other text as it is."""
    text = unwrap(text)
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    if lowered in ("inf", "infinity"):
        return math.inf
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    if ":" in text:
        nested = parse_spec(text)
        return format_spec(nested.name, ((key, spelled(typed(value))) for key, value in nested.items))
    return text


def spelled(value: object) -> str:
    """A value as a spec string writes it; ``typed`` reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(value)
