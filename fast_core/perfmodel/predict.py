"""Predicted time of one training step per strategy: ``fast model``'s analytical model (Castello et al. 2021).

compute: the model's layers on one node (``layers.step_compute_seconds``), slowed when ranks share cores.
communication, per strategy, over links of latency a and bandwidth b, for a model of S bytes on N ranks:

- ``allreduce``: MPI's all-reduce (``fast_core.simulate.LinkModel``: recursive halving, or a ring), after the step's
  compute: compute + 2 ceil(log2 N) a + 2 (N-1)/N S/b.
- ``dpsgd:TOPOLOGY``: the d parameter messages of a step leave one after another on the sender's link while the
  next gradient is computed (FAST posts them before it): max(compute, a + d S/b), plus the mixing, (d + 2) S
  moved through memory.
- ``async``, ``adpsgd``: the exchange runs in a communication thread and never holds the trainer: compute + mixing.
- ``gossip``: one peer per step, waited for: compute + a + S/b.
- ``ps:servers=K``: every worker pushes S and pulls S; a server's link carries the N workers' shards of S/K each,
  N S/K each way: compute + 2 (a + max(N/K, 1) S/b).
- ``localsgd:period=H``, ``diloco:period=H``: an all-reduce every H steps: compute + allreduce / H.
- ``easgd`` (``tau`` steps between rounds): the centre's link takes N - 1 models in and sends N - 1 out:
  compute + 2 (a + (N-1) S/b) / tau.
"""

from __future__ import annotations

from dataclasses import dataclass

from fast_core.errors import ConfigError
from fast_core.perfmodel.layers import Layer, parameter_count, step_compute_seconds
from fast_core.perfmodel.machine import Machine
from fast_core.simulate.links import LinkModel
from fast_core.strategies.spec import make_strategy, parse_strategy
from fast_core.topology import make_topology

__all__ = ["MODELLED", "Prediction", "predict"]

MODELLED = ("allreduce", "dpsgd", "async", "adpsgd", "gossip", "ps", "localsgd", "diloco", "easgd")


@dataclass(frozen=True)
class Prediction:
    strategy: str
    compute: float
    communication: float
    """Seconds a step spends communicating (on the critical path or not)."""
    step: float
    """The predicted time of one step."""


def _degree(topology: str, size: int) -> int:
    graph = make_topology(topology, size)
    return len(graph.out_neighbors(0, 0))


def predict(
    strategy: str, layers: list[Layer], batch: int, size: int, machine: Machine, allreduce: str = "halving",
    ranks_per_machine: int | None = None,
) -> Prediction:
    """The predicted step of ``strategy`` for ``layers`` at ``batch`` samples per rank on ``size`` ranks."""
    name, options = parse_strategy(strategy)
    if name not in MODELLED:
        raise ConfigError(f"fast model has no model of '{name}' yet; it models {', '.join(MODELLED)}")
    built = make_strategy(strategy)
    sharing = size if ranks_per_machine is None else ranks_per_machine
    compute = step_compute_seconds(layers, batch, machine, machine.slowdown(sharing))
    nbytes = parameter_count(layers) * machine.dtype_bytes
    a, b = machine.latency, machine.bandwidth
    links = LinkModel(b, a, allreduce=allreduce)
    one = a + nbytes / b
    if size == 1:
        return Prediction(strategy, compute, 0.0, compute)
    if name == "allreduce":
        comm = links.allreduce_seconds(nbytes, size)
        return Prediction(strategy, compute, comm, compute + comm)
    if name in ("dpsgd", "async", "adpsgd"):
        degree = 1 if name == "adpsgd" else _degree(str(options.get("topology", built_topology(built))), size)
        comm = a + degree * nbytes / b
        mixing = (degree + 2) * nbytes / machine.memory_bandwidth
        step = (max(compute, comm) if name == "dpsgd" else compute) + mixing
        return Prediction(strategy, compute, comm, step)
    if name == "gossip":
        return Prediction(strategy, compute, one, compute + one)
    if name == "ps":
        servers = int(options.get("servers", max(1, size // 2)))
        comm = 2 * (a + max(size / servers, 1.0) * nbytes / b)
        return Prediction(strategy, compute, comm, compute + comm)
    if name in ("localsgd", "diloco"):
        comm = links.allreduce_seconds(nbytes, size) / int(built.period)
        return Prediction(strategy, compute, comm, compute + comm)
    comm = 2 * (a + (size - 1) * nbytes / b) / int(built.tau)  # easgd
    return Prediction(strategy, compute, comm, compute + comm)


def built_topology(strategy: object) -> str:
    topology = getattr(strategy, "topology", "ring")
    return topology if isinstance(topology, str) else "ring"
