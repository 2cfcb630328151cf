"""How long each simulated worker computes each step: a base time, machines of different speeds, noisy steps,
named stragglers. Drawn from a generator per rank, so a run is the same for a seed whatever the event order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fast_core.errors import ConfigError

__all__ = ["ComputeTimes"]


@dataclass
class ComputeTimes:
    """Virtual seconds of one step's forward and backward pass, per rank and step.

    A rank's step takes ``step_seconds`` x its machine factor x a per-step factor x its straggler factor:
    - machine factor: lognormal(0, ``machine_spread``), drawn once per rank (some machines are slower all along);
    - per-step factor: lognormal(0, ``step_spread``), or with ``heavy_tail=a`` a Pareto factor of index a
      (1 + Pareto(a), divided by its mean so the mean step is unchanged; a < 2 has the rare very long pauses of
      shared clusters);
    - ``stragglers``: rank -> a fixed factor (3.0: that rank is three times slower).
    """

    step_seconds: float = 0.01
    machine_spread: float = 0.0
    step_spread: float = 0.0
    heavy_tail: float | None = None
    stragglers: dict[int, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.step_seconds > 0:
            raise ConfigError(f"step_seconds must be > 0, got {self.step_seconds}")
        if self.machine_spread < 0 or self.step_spread < 0:
            raise ConfigError("machine_spread and step_spread are lognormal sigmas: they must be >= 0")
        if self.heavy_tail is not None and not self.heavy_tail > 1:
            raise ConfigError(f"heavy_tail is a Pareto index and must be > 1 (a finite mean), got {self.heavy_tail}")
        if any(not factor > 0 for factor in self.stragglers.values()):
            raise ConfigError(f"straggler factors must be > 0, got {self.stragglers}")
        self._generators: dict[int, np.random.Generator] = {}
        self._machine: dict[int, float] = {}

    def _generator(self, rank: int) -> np.random.Generator:
        if rank not in self._generators:
            self._generators[rank] = np.random.default_rng([self.seed, rank, 7])
            self._machine[rank] = float(self._generators[rank].lognormal(0.0, self.machine_spread))
        return self._generators[rank]

    def draw(self, rank: int) -> float:
        """The next step's compute time of ``rank`` (each rank's draws come from its own stream, in order)."""
        generator = self._generator(rank)
        factor = self._machine[rank] * self.stragglers.get(rank, 1.0)
        if self.heavy_tail is not None:
            a = self.heavy_tail
            factor *= (1.0 + generator.pareto(a)) * (a - 1) / a  # E[1 + Pareto(a)] = a / (a - 1)
        elif self.step_spread:
            factor *= generator.lognormal(0.0, self.step_spread)
        return self.step_seconds * factor
