"""Data parallelism against pipeline (model) parallelism: the step of each layout over the same N ranks.

One cost model, used by ``fast model --stages K`` (terms predicted from layers and a machine) and by
benchmarks/decoupled.py (the same terms measured):

- data parallelism (1 x N): a step costs C + A + U, the whole model's compute on one replica's batch, the
  all-reduce of its parameters over N ranks, and the optimizer's update.
- decoupled stages (K x D, ``fast_torch.DecoupledTrainer``; Pham & Ahn's analysis): no stage waits for the
  others' backward pass, so a tick costs the slowest stage's work, C_K + A_D(P_K) + 2 S + U_K: its compute on a
  replica's batch (B/D of a global batch B), the all-reduce of its parameters over its D replicas, an
  activation sent forward and an error sent back, and its update.
- GPipe (K stages, M micro-batches, all of a step's micro-batches before one update): (M + K - 1) slots of the
  slowest stage's work on a micro-batch plus its two messages, then the all-reduce and the update.
"""

from __future__ import annotations

from dataclasses import dataclass

from fast_core.errors import ConfigError
from fast_core.perfmodel.layers import Layer, parameter_count, step_compute_seconds, update_seconds
from fast_core.perfmodel.machine import Machine
from fast_core.simulate.links import LinkModel

__all__ = ["StageTerms", "data_parallel_step", "decoupled_tick", "gpipe_step", "pipeline_terms", "split_by_flops"]


@dataclass(frozen=True)
class StageTerms:
    """Seconds of the slowest stage's work: compute on its batch, all-reduce among its replicas, one message
    (activation or error), the optimizer's update."""

    compute: float
    allreduce: float
    message: float
    update: float


def data_parallel_step(compute: float, allreduce: float, update: float) -> float:
    return compute + allreduce + update


def decoupled_tick(stage: StageTerms) -> float:
    return stage.compute + stage.allreduce + 2 * stage.message + stage.update


def gpipe_step(stage: StageTerms, stages: int, micro_batches: int) -> float:
    """``stage.compute`` and ``stage.message`` on the whole batch; each of the M + K - 1 slots does 1/M of them."""
    slot = (stage.compute + 2 * stage.message) / micro_batches
    return (micro_batches + stages - 1) * slot + stage.allreduce + stage.update


def split_by_flops(layers: list[Layer], stages: int) -> list[list[Layer]]:
    """Contiguous stages of about equal forward flops (the slowest stage sets the pace)."""
    if not 1 <= stages <= len(layers):
        raise ConfigError(
            f"{stages} pipeline stages cannot split a model of {len(layers)} layers (each stage holds at least one): "
            f"give --stages between 1 and {len(layers)}, or more --layers"
        )
    total = sum(layer.flops for layer in layers)
    parts: list[list[Layer]] = [[] for _ in range(stages)]
    done = 0.0
    for index, layer in enumerate(layers):
        left = len(layers) - index
        stage = min(int(done / total * stages), stages - 1)
        stage = max(stage, stages - left)  # leave a layer for every later stage
        while stage > 0 and not parts[stage - 1]:
            stage -= 1
        parts[stage].append(layer)
        done += layer.flops
    return parts


def pipeline_terms(
    layers: list[Layer], batch: int, size: int, stages: int, machine: Machine, ranks_per_machine: int = 1
) -> StageTerms:
    """The slowest stage's terms when ``size`` ranks hold ``stages`` stages of ``size // stages`` replicas, each
    replica a batch of ``batch`` (the global batch over the replicas)."""
    replicas = size // stages
    links = LinkModel(machine.bandwidth, machine.latency)
    slowdown = machine.slowdown(ranks_per_machine)
    slowest, worst = [], -1.0
    for part in split_by_flops(layers, stages):
        seconds = step_compute_seconds(part, batch, machine, slowdown)
        if seconds > worst:
            slowest, worst = part, seconds
    nbytes = parameter_count(slowest) * machine.dtype_bytes
    update = update_seconds(slowest, machine) * slowdown  # as step_compute_seconds counted it
    activation = machine.latency + batch * slowest[-1].outputs * machine.dtype_bytes / machine.bandwidth
    return StageTerms(worst - update, links.allreduce_seconds(nbytes, replicas), activation, update)
