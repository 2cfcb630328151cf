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
    """Another worker failed (it raised in the same in-process cluster, or MPI reported an error on a message from
    it), so this one stops instead of waiting for it."""


class MessageError(FastError):
    """A message from a peer does not match what this rank expected (size, dtype, or header)."""


class ModelMismatchError(FastError, ValueError):
    """Ranks hold different models (names, shapes or dtypes differ), detected by the layout fingerprint."""


class ConfigError(ValueError):
    """A strategy, topology or option was given a value FAST cannot use; the message says how to fix it."""
