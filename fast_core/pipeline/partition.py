"""Split a sequence of layers into contiguous stages of balanced cost (parameters, measured seconds, flops)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def balanced_split(costs: Sequence[float], stages: int) -> list[int]:
    """Boundaries ``[0, b1, ..., len(costs)]`` of ``stages`` contiguous, non-empty groups of layers whose largest
    total cost is the smallest possible (the linear partition problem, solved exactly by dynamic programming: a
    pipeline runs at the pace of its slowest stage)."""
    costs = [float(c) for c in costs]
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"cannot split {n} layers into {stages} non-empty stages: give 1 to {n} stages")
    if any(c < 0 for c in costs):
        raise ValueError("layer costs must be >= 0")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    # best[s][i]: the smallest largest-stage cost of the first i layers in s stages; cut[s][i]: where stage s begins
    best = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    bounds = [n]
    for s in range(stages, 0, -1):
        bounds.append(int(cut[s][bounds[-1]]))
    return bounds[::-1]
