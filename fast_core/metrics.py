"""Per-worker counters every strategy updates, exposed as a plain dict for logs, progress bars and benchmarks."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field


@dataclass
class Metrics:
    """What one worker did: steps, samples, traffic, time spent waiting on peers, staleness of what it mixed."""

    steps: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    wait_seconds: float = 0.0
    staleness_sum: int = 0
    staleness_count: int = 0
    staleness_max: int = 0
    consensus_distance: float | None = None
    samples: int = 0
    """Samples this rank trained, as granted by ``Worker.claim_batch``."""
    job_samples: int | None = None
    """Samples the whole job trained, summed in ``close()`` under a shared work budget (None before, or without)."""
    samples_left: int | None = None
    """Samples the job's sample budget has left as this rank last knew it (None without one): exact on rank 0 and
    under a synchronous strategy; elsewhere, under an asynchronous one, as rank 0's last grant said."""
    refused_messages: int = 0
    """Messages from neighbours left out because they held NaN or Inf (``fast_core.strategies.integrity``)."""
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self._refused_from: set[int] = set()
        self._lock = threading.Lock()  # refusals are counted by the trainer and by communication threads

    def record_refusal(self, peer: int) -> bool:
        """Count one refused message of ``peer``; True the first time for that peer (log it once, not every step)."""
        with self._lock:
            self.refused_messages += 1
            first = peer not in self._refused_from
            self._refused_from.add(peer)
            return first

    def record_staleness(self, steps_behind: int) -> None:
        self.staleness_sum += steps_behind
        self.staleness_count += 1
        self.staleness_max = max(self.staleness_max, steps_behind)

    def as_dict(self) -> dict[str, float | int | None]:
        data = asdict(self)
        elapsed = time.perf_counter() - data.pop("started")
        data["elapsed_seconds"] = elapsed
        data["steps_per_second"] = self.steps / elapsed if elapsed > 0 else 0.0
        data["mean_staleness"] = self.staleness_sum / self.staleness_count if self.staleness_count else 0.0
        return data
