"""Predicted time of one training step per strategy: ``fast model``'s analytical model (Castello et al. 2021).

compute: the model's layers on one node (``layers.step_compute_seconds``), slowed when ranks share cores.
communication: each strategy says what one exchange sends (``Strategy.cost_profile``, fast_core.strategies.cost);
the model prices it over links of latency a and bandwidth b, for a model of S bytes on N ranks:

- an all-reduce (``allreduce``; ``localsgd``, ``diloco`` every H steps): MPI's all-reduce
  (``fast_core.simulate.LinkModel``: recursive halving, or a ring), 2 ceil(log2 N) a + 2 (N-1)/N S/b;
- otherwise r rounds of m model-sized messages in a row on the busiest link: r (a + m S/b). ``dpsgd:TOPOLOGY``,
  ``async``: one round to the d out-neighbours; ``adpsgd``, ``gossip``: one peer; ``ps:servers=K``: push and pull,
  a server's link carries N/K shares of S (one at least); ``easgd``: the centre's link, N - 1 models in and out;
- spread over the period P of the exchange (local SGD's H, EASGD's tau, ``every=k`` multiplies it): / P.

The step: compute + communication when it waits (all-reduce, gossip, ps, easgd); max(compute, communication)
when the exchange overlaps the next compute (D-PSGD posts it before); compute alone when a communication thread
carries it (``async``, ``adpsgd``). Strategies that mix add their mixing, (d + 2) S moved through memory, / P.
A Schedule (``warmup=W``) is priced by its last phase, the one that runs to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from fast_core.errors import ConfigError
from fast_core.perfmodel.layers import Layer, parameter_count, step_compute_seconds
from fast_core.perfmodel.machine import Machine
from fast_core.simulate.links import LinkModel
from fast_core.strategies.cost import CostProfile
from fast_core.strategies.registry import STRATEGIES
from fast_core.strategies.spec import StrategySpec

__all__ = ["Prediction", "modelled", "predict"]


@dataclass(frozen=True)
class Prediction:
    strategy: str
    compute: float
    communication: float
    """Seconds a step spends communicating (on the critical path or not)."""
    step: float
    """The predicted time of one step."""


def predict(
    strategy: str | StrategySpec, layers: list[Layer], batch: int, size: int, machine: Machine,
    allreduce: str = "halving", ranks_per_machine: int | None = None, label: str | None = None,
) -> Prediction:
    """The predicted step of ``strategy`` for ``layers`` at ``batch`` samples per rank on ``size`` ranks, named
    ``label`` (default: the strategy string as given, or the spec's canonical text)."""
    spec = strategy if isinstance(strategy, StrategySpec) else StrategySpec.parse(strategy)
    label = str(strategy) if label is None else label
    profile = spec.build().cost_profile(size)
    if profile is None:
        raise ConfigError(f"fast model has no model of '{spec.name}' yet; it models {', '.join(modelled())}")
    sharing = size if ranks_per_machine is None else ranks_per_machine
    compute = step_compute_seconds(layers, batch, machine, machine.slowdown(sharing))
    if size == 1:
        return Prediction(label, compute, 0.0, compute)
    nbytes = parameter_count(layers) * machine.dtype_bytes
    comm = _exchange_seconds(profile, nbytes, size, machine, allreduce) / profile.period
    mixing = profile.mixing_copies * nbytes / machine.memory_bandwidth / profile.period
    waited = {"waits": compute + comm, "overlaps": max(compute, comm), "background": compute}[profile.timing]
    return Prediction(label, compute, comm, waited + mixing)


def _exchange_seconds(profile: CostProfile, nbytes: int, size: int, machine: Machine, allreduce: str) -> float:
    """Seconds one exchange takes on the busiest link."""
    if profile.allreduce:
        return LinkModel(machine.bandwidth, machine.latency, allreduce=allreduce).allreduce_seconds(nbytes, size)
    return profile.rounds * (machine.latency + profile.models_per_round * nbytes / machine.bandwidth)


def modelled() -> list[str]:
    """The strategy names whose strategies answer ``cost_profile`` (built with their defaults)."""
    return sorted(name for name in STRATEGIES if StrategySpec(name).build().cost_profile(16) is not None)
