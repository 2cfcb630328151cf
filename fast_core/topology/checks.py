"""What every topology function checks first: ranks, sizes and weight rules, with errors that say how to fix them."""

from __future__ import annotations

import operator

from fast_core.errors import ConfigError

WEIGHT_RULES = ("uniform", "metropolis")
TOL = 1e-9
"""Tolerance of the stochasticity checks (row sums, nonnegative entries)."""
_MAX_LISTED = 10


class TopologyError(ConfigError):
    """A topology was asked for something it cannot be; the message says what is wrong and how to fix it."""


def checked_rank(rank: int, size: int, what: str) -> int:
    try:
        index = operator.index(rank)
    except TypeError:
        raise TopologyError(f"{what} must be an integer, got {rank!r}") from None
    if not 0 <= index < size:
        raise TopologyError(f"{what} {rank} is out of range; valid ranks are 0..{size - 1} (size is {size})")
    return index


def checked_size(size: int) -> int:
    try:
        value = operator.index(size)
    except TypeError:
        raise TopologyError(f"size must be an integer >= 1, got {size!r}") from None
    if value < 1:
        raise TopologyError(f"size must be >= 1 (the number of ranks), got {size}")
    return value


def checked_peers(k: object) -> int:
    """The k of the k-peer graphs: how many peers a rank talks to per step (text from a strategy string too)."""
    try:
        value = int(k) if isinstance(k, str) else operator.index(k)
    except (TypeError, ValueError):
        raise TopologyError(f"k (peers per rank per step) must be an integer >= 1, got {k!r}") from None
    if value < 1:
        raise TopologyError(f"k (peers per rank per step) must be >= 1, got {value}; k=1 talks to one peer a step")
    return value


def checked_rule(weights: str) -> str:
    if weights not in WEIGHT_RULES:
        raise TopologyError(f"unknown weight rule {weights!r}; use one of: {', '.join(WEIGHT_RULES)}")
    return weights


def listed(ranks: list[int]) -> str:
    if len(ranks) <= _MAX_LISTED:
        return str(ranks)
    return f"{ranks[:_MAX_LISTED]} ... ({len(ranks)} in all)"
