"""Which rank runs which stage of which pipeline replica: the K x D grid of decoupled pipeline training.

A network split into ``stages`` (K) is replicated ``replicas`` (D) times over ``size = K * D`` ranks. One replica's
stages occupy consecutive ranks (rank = replica * K + stage), so a pipeline's activations usually stay on one
machine when the launcher fills machines rank by rank, while the replicas of a stage (which average their
parameters with a normal FAST strategy) are K ranks apart.
"""

from __future__ import annotations

__all__ = ["Grid"]


class Grid:
    """The mapping rank <-> (stage, replica) of ``size`` ranks running ``stages`` pipeline stages."""

    def __init__(self, size: int, stages: int) -> None:
        if stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got stages={stages}")
        if size < 1 or size % stages != 0:
            raise ValueError(
                f"{size} ranks cannot run {stages} stages: the number of ranks must be a positive multiple of the "
                f"number of stages (each stage is replicated size // stages times); launch a multiple of {stages} "
                "ranks, or choose a number of stages that divides the number of ranks"
            )
        self.size = size
        self.stages = stages
        self.replicas = size // stages

    def stage(self, rank: int) -> int:
        """The pipeline stage ``rank`` runs."""
        return self._check_rank(rank) % self.stages

    def replica(self, rank: int) -> int:
        """The pipeline replica ``rank`` belongs to."""
        return self._check_rank(rank) // self.stages

    def rank(self, stage: int, replica: int) -> int:
        """The rank that runs ``stage`` of ``replica``."""
        if not 0 <= stage < self.stages:
            raise ValueError(f"stage {stage} does not exist: {self!r} has stages 0..{self.stages - 1}")
        if not 0 <= replica < self.replicas:
            raise ValueError(f"replica {replica} does not exist: {self!r} has replicas 0..{self.replicas - 1}")
        return replica * self.stages + stage

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """The ranks running ``stage``, in replica order: the group that averages that stage's parameters."""
        return tuple(self.rank(stage, replica) for replica in range(self.replicas))

    def previous(self, rank: int) -> int | None:
        """The rank of the stage before ``rank``'s in the same replica (it sends the activations), None at stage 0."""
        return None if self.stage(rank) == 0 else rank - 1

    def next(self, rank: int) -> int | None:
        """The rank of the stage after ``rank``'s in the same replica (it sends the error gradients), None at the
        last stage."""
        return None if self.stage(rank) == self.stages - 1 else rank + 1

    def _check_rank(self, rank: int) -> int:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} does not exist: {self!r} has ranks 0..{self.size - 1}")
        return rank

    def __repr__(self) -> str:
        return f"Grid({self.size} ranks = {self.stages} stages x {self.replicas} replicas)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Grid) and (self.size, self.stages) == (other.size, other.stages)

    def __hash__(self) -> int:
        return hash((self.size, self.stages))
