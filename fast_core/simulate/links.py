"""When a simulated message arrives: latency, bandwidth, and contention at each worker's link and at a switch.

Every worker has one full-duplex link (a NIC) of ``bandwidth`` bytes per second to a switch. A message of S bytes
sent at t leaves once the sender's outgoing link is free (messages of one sender queue one after another), crosses
the switch (when ``switch_bandwidth`` is set, all messages of the job share it, in the order they were sent),
and is received once the receiver's incoming link is free: that queue is what makes a parameter server's link the
bottleneck when N workers push to it at once. It lands ``latency`` seconds after its last byte left. Queues are
served in the order messages are sent, not re-sorted by arrival: a simplification that keeps each message's time
fixed when it is sent.

Collectives are costed as their usual algorithms over these links, without queueing behind point-to-point
messages: an all-reduce by recursive halving and doubling (MPI's algorithm for large messages) 2 ceil(log2 N)
latency + 2 (N-1)/N S/bandwidth, or by a ring 2(N-1)(latency + S/(N bandwidth)); a binomial-tree broadcast
ceil(log2 N)(latency + S/bandwidth); a barrier 2 ceil(log2 N) latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fast_core.errors import ConfigError

__all__ = ["LinkModel", "parse_rate"]

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str | float) -> float:
    """Bits per second as tc writes them ("100mbit", "1gbit", "10mbit", or a number of bit/s) -> bytes per second."""
    if isinstance(text, int | float):
        return float(text) / 8
    value = text.strip().lower().removesuffix("bit").removesuffix("bps")
    unit = value[-1] if value and value[-1] in "kmg" else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise ConfigError(f"link rate {text!r} is not a rate; write e.g. 100mbit, 1gbit or 10mbit") from None
    if number <= 0:
        raise ConfigError(f"link rate {text!r} must be positive")
    return number * _UNITS[unit] / 8


@dataclass
class LinkModel:
    """Links of one simulated cluster (bandwidths in bytes per second, times in seconds)."""

    bandwidth: float = 1.25e8
    """Each worker's link, each way (default 1 Gbit/s)."""
    latency: float = 50e-6
    """One way, per message."""
    switch_bandwidth: float | None = None
    """Shared by every message of the job (None: a non-blocking switch)."""
    per_rank: dict[int, float] = field(default_factory=dict)
    """Ranks whose link has another bandwidth (a host on a slow link)."""
    allreduce: str = "halving"
    """How an all-reduce is costed: "halving" (MPI's large-message algorithm; FAST's ``allreduce`` strategy calls
    MPI_Allreduce) or "ring"."""

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or not self.latency >= 0:
            raise ConfigError(f"links need bandwidth > 0 and latency >= 0, got {self.bandwidth} and {self.latency}")
        if self.switch_bandwidth is not None and not self.switch_bandwidth > 0:
            raise ConfigError(f"switch bandwidth must be > 0 (or None), got {self.switch_bandwidth}")
        if self.allreduce not in ("halving", "ring"):
            raise ConfigError(f"all-reduce algorithm {self.allreduce!r} is not modelled; use halving or ring")

    def rate(self, rank: int) -> float:
        return self.per_rank.get(rank, self.bandwidth)

    def slowest(self, size: int) -> float:
        return min(self.rate(r) for r in range(size))

    def allreduce_seconds(self, nbytes: int, size: int) -> float:
        """"halving": Rabenseifner's reduce-scatter by recursive halving then all-gather by doubling, MPICH's
        choice for large messages, 2 ceil(log2 N) latencies; "ring": 2(N-1) steps of a 1/N chunk (NCCL, Horovod,
        Baidu), 2(N-1) latencies. Both move 2(N-1)/N of the buffer over the slowest link."""
        if size == 1:
            return 0.0
        volume = 2 * (size - 1) / size * nbytes / self.slowest(size)
        steps = 2 * math.ceil(math.log2(size)) if self.allreduce == "halving" else 2 * (size - 1)
        return steps * self.latency + volume

    def broadcast_seconds(self, nbytes: int, size: int) -> float:
        if size == 1:
            return 0.0
        return math.ceil(math.log2(size)) * (self.latency + nbytes / self.slowest(size))

    def barrier_seconds(self, size: int) -> float:
        return 0.0 if size == 1 else 2 * math.ceil(math.log2(size)) * self.latency


class LinkQueues:
    """The time each link (and the switch) is next free: the state of the contention model."""

    def __init__(self, model: LinkModel, size: int) -> None:
        self.model = model
        self.outgoing = [0.0] * size
        self.incoming = [0.0] * size
        self.switch = 0.0

    def send(self, now: float, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        """Reserve the links for a message sent at ``now``: (when its last byte left the sender, when it lands)."""
        model = self.model
        start = max(now, self.outgoing[src])
        left = start + nbytes / model.rate(src)
        self.outgoing[src] = left
        if model.switch_bandwidth is not None:
            through = max(start, self.switch) + nbytes / model.switch_bandwidth
            self.switch = through
            left_switch = max(left, through)
        else:
            left_switch = left
        received = max(left_switch, max(start, self.incoming[dst]) + nbytes / model.rate(dst))
        self.incoming[dst] = received
        return left, received + model.latency
