"""A parameter server (Dean et al. 2012; the baseline of FAST's own experiment, Viviani 2019: 16 workers, 8 servers).

The flat parameter vector is cut into ``servers`` contiguous shards (``numpy.array_split``); shard s is owned by
rank s, which is a worker too (servers are co-located on ranks 0..S-1). ``ParameterServer(...)`` builds one of two
classes, as ``FAST(...)`` does: ``SyncPS`` (here, ``mode="sync"``, the default) and ``AsyncPS`` (ps_async.py,
``mode="async"``, Downpour SGD).

Both keep the user's optimizer (momentum, Adam, its learning rate) on the workers rather than re-implementing SGD
on the server, which would need the learning rate as an option and would drop any other optimizer:

- sync: every worker pushes shard s of its gradient to server s; the server averages the N shards and sends the
  average back; each worker's optimizer applies the averaged gradient. All workers start equal and apply the same
  gradient with the same optimizer, so every worker's copy *is* the servers' parameters (pulling the parameters
  instead would carry the same numbers in the same bytes): the run equals all-reduce SGD.
- async: a worker pushes its update (its optimizer's step since its last pull) to each server and pulls back the
  server's current shard; each server adds every update as it arrives, times ``scale``, so a server's shard is
  always the start plus ``scale`` times the sum of all updates pushed to it (with SGD: minus scale * lr times the
  sum of all pushed gradients). ``scale`` defaults to 1/N: with ``scale=1`` (Downpour as published) a learning rate
  tuned for all-reduce moved the servers N times as far per round of pushes and, with momentum 0.9 on 4 ranks
  (the torch digits CNN, 15 epochs), ended at 0.81-0.99 where all-reduce reached 0.994; 1/N gave 0.983-0.994.

Bytes per step: a worker sends one gradient (or update) and receives one vector, whatever N; server s's link also
carries the N - 1 other workers' shard s both ways, N / S times a worker's traffic when the shards are equal.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from fast_core.compression import ParameterWire, parameter_codec
from fast_core.errors import ConfigError
from fast_core.strategies.base import Strategy
from fast_core.strategies.checks import ChoosesVariant
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.integrity import check_own, refused
from fast_core.strategies.registry import registered
from fast_core.transport.tags import Tag

if TYPE_CHECKING:
    from fast_core.engine import Request
    from fast_core.strategies.base import GroupChange, StepContext

log = logging.getLogger("fast")

MODES = {"sync": True, "async": False}


def shard_bounds(size: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's shard of a flat vector of ``size`` values: numpy.array_split's cut."""
    ends = np.cumsum([0] + [len(part) for part in np.array_split(np.arange(size), servers)])
    return [(int(lo), int(hi)) for lo, hi in zip(ends[:-1], ends[1:], strict=True)]


def check_servers(servers: object, size: int) -> int:
    """The number of servers for ``size`` ranks: ``servers`` itself (None: max(1, size // 2), Viviani's 8 of 16)."""
    if servers is None:
        return max(1, size // 2)
    check_count(servers)
    if servers > size:
        raise ConfigError(
            f"ps:servers={servers} needs at least {servers} ranks (servers live on ranks 0..servers-1), but the job "
            f"has {size}; use ps:servers={max(1, size // 2)} or launch more ranks"
        )
    return servers


def check_count(servers: object) -> None:
    """A whole number of servers >= 1, before the job's size is known."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"ps servers must be a whole number >= 1, got {servers!r}; e.g. ps:servers=2")


@registered
class ParameterServer(Strategy, ChoosesVariant):
    """Workers push gradients (sync) or updates (async) shard by shard to ``servers`` servers and pull back.

    ``servers``: how many; None is max(1, N // 2), the ratio of Viviani's 16 workers and 8 servers.
    ``mode``: "sync" (all workers meet at every step: the same numbers as all-reduce) or "async" (Downpour: no
    worker waits for another). ``scale``: what a server multiplies the sum of the pushes by (sync: the N gradients
    of a step, so None, 1/N, is their mean; async: each update as it arrives, so None lets N pushes move the server
    as far as one all-reduce step, and a learning rate tuned for all-reduce fits; ``scale=1`` is Downpour as
    published, every worker's step counting whole: N times the step of all-reduce per round of pushes).
    ``staleness=s`` (async only): a worker that finished step k waits until every worker has pushed step k - s
    (stale synchronous parallel, Ho et al. 2013); None never waits.
    ``compress``: a dense codec ("fp16", "bf16", "int8") for both directions; every worker, the server's own
    included, applies what the others decode, so the replicas stay equal in sync mode.
    A lost rank (fault-tolerant job): the survivors re-cut the shards over the new group, each new server taking
    its shard from the parameters the Worker left every survivor at (their average), so an async server's updates
    not yet pulled by any survivor are lost with it; ``servers`` shrinks to the group's size if it must.
    """

    name = "ps"
    synchronous = True  # the family's default; each variant declares its own

    def __new__(
        cls,
        servers: int | None = None,
        mode: str = "sync",
        scale: float | None = None,
        staleness: float | None = None,
        compress: str | None = "none",
    ) -> ParameterServer:
        return super().__new__(cls._variant(_mode(mode)))

    def __init__(
        self,
        servers: int | None = None,
        mode: str = "sync",
        scale: float | None = None,
        staleness: float | None = None,
        compress: str | None = "none",
    ) -> None:
        if _mode(mode) != self.synchronous:
            own = "sync" if self.synchronous else "async"
            raise ConfigError(f"{type(self).__name__} runs mode={own}, got mode={mode!r}; build ParameterServer(...)")
        if servers is not None:
            check_count(servers)  # against the job's size at setup
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0):
            raise ConfigError(f"ps scale must be a number > 0 (none: 1/N), got {scale!r}; e.g. ps:mode=async,scale=1")
        self.servers = servers
        self.mode = str(mode)
        self.scale = scale
        self.staleness = check_staleness(staleness, self.synchronous, compress)
        self.compress = "none" if compress is None else str(compress)
        self._codec = parameter_codec(compress, "ps")
        self._clamp = False

    def cost_profile(self, size: int) -> CostProfile:
        """Every worker pushes its vector and pulls the model; a server's link carries the workers' shares of it,
        size / servers models each way (one at least)."""
        servers = self.servers if self.servers is not None else max(1, size // 2)
        return CostProfile(rounds=2, models_per_round=max(size / servers, 1.0))

    def setup(self, ctx: StepContext) -> None:
        count = check_servers(min(self.servers, ctx.size) if self._clamp and self.servers else self.servers, ctx.size)
        self._bounds = shard_bounds(ctx.layout.size, count)
        self._others = [r for r in range(ctx.size) if r != ctx.rank]
        self._own = ctx.rank if ctx.rank < count else None  # the shard this rank serves, if any
        self._scale = 1.0 / ctx.size if self.scale is None else float(self.scale)

    def rejoin(self, ctx: StepContext, change: GroupChange) -> None:
        """Re-cut the shards over the survivors, from the parameters the Worker left them at (their average)."""
        self._clamp = True
        if ctx.rank == 0 and self.servers and self.servers > ctx.size:
            log.warning("ps: %d servers do not fit %d ranks; going on with %d", self.servers, ctx.size, ctx.size)
        self.setup(ctx)

    def __repr__(self) -> str:
        return (
            f"ParameterServer(servers={self.servers!r}, mode={self.mode!r}, scale={self.scale!r}, "
            f"staleness={self.staleness!r}, compress={self.compress!r})"
        )


def check_staleness(staleness: object, synchronous: bool, compress: object) -> int | None:
    """A whole number of steps >= 0, or None (inf) for no bound; only asynchronous and uncompressed (the step
    travels in the message's last value, which a codec would round)."""
    if staleness is None or staleness == math.inf:
        return None
    if isinstance(staleness, bool) or not isinstance(staleness, int | float) or staleness < 0:
        raise ConfigError(f"ps staleness must be a whole number of steps >= 0 (or none), got {staleness!r}")
    if synchronous:
        raise ConfigError("ps staleness bounds the asynchronous mode; use ps:mode=async,staleness=S")
    if compress not in (None, "none"):
        raise ConfigError(f"ps staleness cannot travel compressed (compress={compress}): give one or the other")
    return int(staleness)


def _mode(mode: object) -> bool:
    if mode not in MODES:
        raise ConfigError(f"ps mode must be 'sync' or 'async', got {mode!r}; e.g. ps:servers=2,mode=async")
    return MODES[mode]  # type: ignore[index]


class SyncPS(ParameterServer):
    """Push gradient shards, average them on their servers, pull the averages, apply with the user's optimizer."""

    lockstep = True
    synchronous = True
    uses_gradients = True

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self._push = [ParameterWire(self._codec, feedback=False) for _ in self._bounds]
        self._pull = [ParameterWire(self._codec, feedback=False) for _ in self._bounds]
        self._sent = ctx.layout.empty()
        self._averaged = ctx.layout.empty()
        if self._own is not None:
            lo, hi = self._bounds[self._own]
            self._heard = [np.empty(hi - lo, ctx.layout.dtype) for _ in self._others]

    def before_step(self, ctx: StepContext) -> None:
        grads = ctx.model.grads()
        check_own(ctx, grads, "gradients", every=1)
        np.copyto(self._sent, grads)
        self._round(ctx, self._push, self._sent, Tag.PS_PUSH, to_servers=True)
        if self._own is not None:
            self._average(ctx)
        self._round(ctx, self._pull, self._averaged, Tag.PS_PULL, to_servers=False)
        ctx.model.set_grads(self._averaged)

    def _round(self, ctx: StepContext, wires: list[ParameterWire], vector: np.ndarray, tag: int, to_servers: bool):
        """One exchange per shard: every worker to its server (push), or every server to all workers (pull)."""
        requests: list[Request] = []
        for server, (wire, (lo, hi)) in enumerate(zip(wires, self._bounds, strict=True)):
            serving = server == ctx.rank
            if to_servers:
                dests, sources = ([], self._others) if serving else ([server], [])
                recvs = self._heard if serving else []
            else:
                dests, sources = (self._others, []) if serving else ([], [server])
                recvs = [] if serving else [vector[lo:hi]]
            requests += wire.exchange(ctx.engine, vector[lo:hi], dests, recvs, sources, tag, ctx.step)
        ctx.engine.wait_all(requests)
        for wire in wires:
            wire.finish()

    def _average(self, ctx: StepContext) -> None:
        """This server's shard of the mean gradient (a NaN/Inf shard is refused: the mean of those heard)."""
        lo, hi = self._bounds[self._own]
        total = self._averaged[lo:hi]
        np.copyto(total, self._sent[lo:hi])
        heard = 1
        for peer, shard in zip(self._others, self._heard, strict=True):
            if not refused(ctx, peer, shard, "gradients"):
                total += shard
                heard += 1
        total *= 1.0 / heard if self.scale is None else self._scale  # None: the mean of the gradients heard
        if self._codec is not None:  # apply what the other workers decode, so all replicas stay equal
            total[:] = self._codec.decode(self._codec.encode(total), hi - lo)
