"""fast_core.pipeline.Grid maps ranks to (stage, replica); replica_group gives each stage's replicas an engine."""

from __future__ import annotations

import numpy as np
import pytest
from training import train

from fast_core import LocalCluster
from fast_core.pipeline import Grid, replica_group


def test_a_pipeline_occupies_consecutive_ranks_and_each_stage_is_every_kth_rank() -> None:
    grid = Grid(6, 3)
    assert (grid.stages, grid.replicas) == (3, 2)
    assert [(grid.stage(r), grid.replica(r)) for r in range(6)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert all(grid.rank(grid.stage(r), grid.replica(r)) == r for r in range(6))
    assert [grid.stage_ranks(s) for s in range(3)] == [(0, 3), (1, 4), (2, 5)]
    assert [grid.previous(r) for r in range(6)] == [None, 0, 1, None, 3, 4]
    assert [grid.next(r) for r in range(6)] == [1, 2, None, 4, 5, None]
    assert repr(Grid(4, 2)) == "Grid(4 ranks = 2 stages x 2 replicas)"


def test_one_stage_is_plain_data_parallelism_and_one_replica_a_single_pipeline() -> None:
    flat = Grid(4, 1)
    assert flat.stage_ranks(0) == (0, 1, 2, 3)
    assert [(flat.previous(r), flat.next(r)) for r in range(4)] == [(None, None)] * 4
    deep = Grid(4, 4)
    assert [deep.stage_ranks(s) for s in range(4)] == [(0,), (1,), (2,), (3,)]
    assert [deep.next(r) for r in range(4)] == [1, 2, 3, None]


@pytest.mark.parametrize(("size", "stages", "match"), [(5, 2, "multiple of 2"), (4, 0, "at least one stage")])
def test_a_grid_that_does_not_divide_the_job_is_refused(size: int, stages: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Grid(size, stages)


def test_ranks_stages_and_replicas_out_of_range_are_refused() -> None:
    grid = Grid(4, 2)
    with pytest.raises(ValueError, match="rank 4 does not exist"):
        grid.stage(4)
    with pytest.raises(ValueError, match="stage 2 does not exist"):
        grid.rank(2, 0)
    with pytest.raises(ValueError, match="replica 2 does not exist"):
        grid.rank(0, 2)


def test_replica_groups_join_the_ranks_of_one_stage_and_average_only_among_them() -> None:
    def body(engine) -> tuple[int, int, float]:
        group = replica_group(engine, Grid(4, 2))
        values = np.array([10.0**engine.rank])
        group.allreduce(values)
        return group.rank, group.size, float(values[0])

    results = LocalCluster(4, timeout=30).run(body)
    assert results == [(0, 2, 101.0), (0, 2, 1010.0), (1, 2, 101.0), (1, 2, 1010.0)]


def test_a_grid_of_another_size_than_the_job_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Grid\(2, stages\)"):
        LocalCluster(2, timeout=30).run(lambda engine: replica_group(engine, Grid(4, 2)))


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd:ring"])
def test_a_worker_on_each_stage_group_trains_exactly_as_a_job_of_that_stage_alone(strategy: str) -> None:
    """Two stages train different models (seeds 0 and 10) at once, each on its two replicas: every replica's
    parameters are bit for bit those of a 2-rank job of that model alone."""
    grid = Grid(4, 2)

    def body(engine) -> np.ndarray:
        model, _ = train(replica_group(engine, grid), strategy, steps=30, seed=10 * grid.stage(engine.rank))
        return model.params().copy()

    grouped = LocalCluster(4, timeout=30).run(body)
    for stage in range(2):
        seed = 10 * stage
        alone = LocalCluster(2, timeout=30).run(lambda e, s=seed: train(e, strategy, steps=30, seed=s)[0].params())
        for replica, rank in enumerate(grid.stage_ranks(stage)):
            assert grouped[rank].tobytes() == alone[replica].tobytes(), (strategy, stage, replica)
    assert not np.array_equal(grouped[0], grouped[1])
