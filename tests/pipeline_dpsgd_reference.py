"""The fully decoupled pipeline's rule under D-PSGD in NumPy, one process: tests/pipeline_reference.py's rule, but
each replica of a stage keeps its own weights and, instead of averaging gradients, mixes its weights with its
neighbours' on a topology of the stage's replicas (``X <- W X - lr G``, fast_core.strategies.dpsgd)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pipeline_reference import Layer, cross_entropy_grad, stage_backward, stage_forward

from fast_core.pipeline.schedule import Schedule
from fast_core.topology import make_topology


def train_dpsgd(
    layers: list[Layer],
    bounds: Sequence[int],
    batches: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]],
    lr: float,
    topology: str = "ring",
) -> list[list[Layer]]:
    """Every replica's layers (``[replica][layer]``) after training ``layers`` (copied) split at ``bounds`` on
    ``batches[replica][i]``: at each update a stage's replica r takes W[r] of the stage's replicas' current
    weights (W of the stage's update count) minus lr times its own gradient."""
    stages, replicas, count = len(bounds) - 1, len(batches), len(batches[0])
    graph = make_topology(topology, replicas)
    weights_of = [[[a.copy() for a in layer] for layer in layers] for _ in range(replicas)]
    schedule = Schedule(stages, count)
    sent: dict[tuple[str, int, int, int], np.ndarray] = {}  # (direction, stage receiving, batch, replica)
    stash: dict[tuple[int, int, int], tuple] = {}
    updates_done = [0] * stages
    for tick in range(schedule.ticks):
        arriving, updates = {}, []
        for k in range(stages):
            own, last = range(bounds[k], bounds[k + 1]), k == stages - 1
            batch = schedule.forward_batch(k, tick)
            if batch is not None:
                for r in range(replicas):
                    weights = [[a.copy() for a in weights_of[r][i]] for i in own]
                    x = batches[r][batch][0] if k == 0 else sent.pop(("forward", k, batch, r))
                    out, inputs = stage_forward(weights, x, last)
                    stash[(k, batch, r)] = (weights, inputs, out)
                    if not last:
                        arriving[("forward", k + 1, batch, r)] = out
            batch = schedule.backward_batch(k, tick)
            if batch is None:
                continue
            grads = []
            for r in range(replicas):
                weights, inputs, out = stash.pop((k, batch, r))
                g = cross_entropy_grad(out, batches[r][batch][1])[1] if last else sent.pop(("back", k, batch, r))
                g_layers, g_in = stage_backward(weights, inputs, g, last)
                grads.append(g_layers)
                if k > 0:
                    arriving[("back", k - 1, batch, r)] = g_in
            updates.append((k, grads))
        for k, grads in updates:  # every stage updates at the end of the tick, as in pipeline_reference.train
            w = graph.mixing_matrix(updates_done[k])
            updates_done[k] += 1
            for local, i in enumerate(range(bounds[k], bounds[k + 1])):
                for part in (0, 1):
                    current = [weights_of[r][i][part] for r in range(replicas)]
                    for r in range(replicas):
                        mixed = sum(w[r, j] * current[j] for j in range(replicas))
                        weights_of[r][i][part] = mixed - lr * grads[r][local][part]
        sent.update(arriving)
    return weights_of
