"""Framework-neutral pieces of data parallelism with decoupled pipeline stages (issue 17): the K x D grid of
ranks, the bounded channels between neighbouring stages, and the engine over a stage's replicas."""

from __future__ import annotations

from fast_core.engine import Engine
from fast_core.pipeline.channel import Channel
from fast_core.pipeline.grid import Grid
from fast_core.transport.tags import PipelineTag

__all__ = ["Channel", "Grid", "PipelineTag", "replica_group"]


def replica_group(engine: Engine, grid: Grid) -> Engine:
    """The engine over the replicas of this rank's stage (collective: every rank of ``engine`` calls it), on which a
    normal FAST Worker and strategy average the stage's parameters; its ranks are the replicas, in replica order."""
    if grid.size != engine.size:
        raise ValueError(f"{grid!r} does not fit this job of {engine.size} ranks: make it Grid({engine.size}, stages)")
    return engine.split(grid.stage(engine.rank))
