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


class PeerLost(PeerFailed):
    """A fault-tolerant engine found that a rank of the job is gone (its process died): the survivors can shrink
    the group (``FaultTolerant.shrink``) and go on. ``ranks``: the lost ranks' numbers in the job as first launched
    (``FaultTolerant.world_ranks``), when known at the time of the error (empty otherwise: ``shrink`` tells)."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks


class MessageError(FastError):
    """A message from a peer does not match what this rank expected (size, dtype, or header)."""


class ModelMismatchError(FastError, ValueError):
    """Ranks hold different models (names, shapes or dtypes differ), detected by the layout fingerprint."""


class ConfigError(ValueError):
    """A strategy, topology or option was given a value FAST cannot use; the message says how to fix it."""
