"""What ``fast model`` knows of a machine: a node's flop rate and memory bandwidth, its links, its cores."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from fast_core.errors import ConfigError

__all__ = ["Machine"]


@dataclass
class Machine:
    peak_flops: float = 1e11
    """Flop rate of a large GEMM on one core (flop/s)."""
    memory_bandwidth: float = 1e10
    """Bytes per second of a large copy (read + write counted)."""
    latency: float = 50e-6
    """One-way latency of a message between two ranks (s)."""
    bandwidth: float = 1.25e8
    """Each rank's link, each way (bytes/s)."""
    step_overhead: float = 0.0
    """The framework's own time per step (s): hooks, Python, small kernels; what a flop count does not see."""
    step_overhead_per_byte: float = 0.0
    """The framework's time per step and parameter byte (s/B): its own passes over the parameters and gradients."""
    cores: int = 1
    """Cores the ranks of one machine share: N ranks on fewer cores compute N / cores times slower."""
    sharing: dict[str, float] = field(default_factory=dict)
    """Measured slowdowns of one rank's compute when that many ranks share the machine ({"4": 3.7}); where none
    is measured, ranks / cores."""
    dtype_bytes: int = 8
    """Bytes per parameter (8: the NumPy models, float64; 4: float32)."""
    measured: str = "defaults"
    """How the figures were obtained (written by --calibrate)."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Machine:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read the machine file {path}: {exc}; write one with fast model --calibrate --machine {path}"
            ) from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"machine file {path} has unknown fields {unknown}; it takes {sorted(known)}")
        return cls(**data)

    def slowdown(self, ranks_per_machine: int) -> float:
        """How much slower each rank computes when ``ranks_per_machine`` share the machine."""
        measured = self.sharing.get(str(ranks_per_machine))
        return measured if measured is not None else max(1.0, ranks_per_machine / self.cores)
