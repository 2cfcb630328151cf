"""Exceptions raised by fast_core, so callers can catch FAST's own failures precisely."""

from __future__ import annotations


class FastError(RuntimeError):
    """Base class of FAST's runtime errors."""


class PeerTimeout(FastError, TimeoutError):
    """A wait on one or more peers did not finish in time; the message names the ranks and what was awaited."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks


class PeerFailed(FastError):
    """Another worker of the same in-process cluster raised, so this one stops instead of waiting forever."""


class MessageError(FastError):
    """A message from a peer does not match what this rank expected (size, dtype, or header)."""


class ModelMismatchError(FastError, ValueError):
    """Ranks hold different models (names, shapes or dtypes differ), detected by the layout fingerprint."""


class ConfigError(ValueError):
    """A strategy, topology or option was given a value FAST cannot use; the message says how to fix it."""
