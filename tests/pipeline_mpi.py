"""Run under ``mpiexec -n 4 python -m mpi4py tests/pipeline_mpi.py``: fast_core.pipeline on real processes, a
Grid(4, 2) of two replicas of a two-stage pipeline (tests/test_pipeline_channel.py). Rank 0 prints one line per
check; a failed assertion aborts the job."""

from __future__ import annotations

import time

import numpy as np

from fast_core.engine import Engine
from fast_core.errors import PeerTimeout
from fast_core.pipeline import Channel, Grid, PipelineTag, replica_group

STEPS = 6
SIZES = [3, 200_000, 0, 17, 150_000, 1]  # 1.6 MB arrays go by rendezvous, not buffered


def activations(replica: int, step: int) -> np.ndarray:
    return np.random.default_rng(100 * replica + step).normal(size=SIZES[step])


def neighbour(grid: Grid, rank: int) -> int:
    """The other stage of a two-stage pipeline."""
    return grid.rank(1 - grid.stage(rank), grid.replica(rank))


def chain(engine: Engine, grid: Grid) -> None:
    """Stage 0 sends activations and reads the error of step t - 1 after sending step t; stage 1 returns x / 3."""
    replica, peer = grid.replica(engine.rank), neighbour(grid, engine.rank)
    forward, backward = Channel(engine, peer, PipelineTag.ACTIVATIONS), Channel(engine, peer, PipelineTag.ERRORS)
    if grid.stage(engine.rank) == 0:
        errors = []
        for step in range(STEPS):
            forward.send(activations(replica, step), step)
            if step >= 1:
                errors.append(backward.recv(step - 1))
        errors.append(backward.recv(STEPS - 1))
        for step, error in enumerate(errors):
            assert error.tobytes() == (activations(replica, step) / 3).tobytes(), (engine.rank, step)
    else:
        for step in range(STEPS):
            backward.send(forward.recv(step, (SIZES[step],)) / 3, step)
    forward.close()
    backward.close()


def groups(engine: Engine, grid: Grid) -> None:
    group = replica_group(engine, grid)
    values = np.array([10.0**engine.rank])
    group.allreduce(values)
    assert values[0] == sum(10.0**r for r in grid.stage_ranks(grid.stage(engine.rank))), values


def depth(engine: Engine, grid: Grid) -> None:
    """A receiver that starts 1 s late: stage 0's third send (depth 2) returns only after it."""
    channel = Channel(engine, neighbour(grid, engine.rank), PipelineTag.ACTIVATIONS + 10, depth=2)
    engine.barrier()
    start = time.monotonic()
    if grid.stage(engine.rank) == 0:
        returned = []
        for step in range(4):
            channel.send(np.full(5, step, dtype=np.float32), step)
            returned.append(time.monotonic() - start)
        assert returned[1] < 0.5 and returned[2] > 0.8, returned
    else:
        time.sleep(1)
        for step in range(4):
            assert channel.recv(step)[0] == step
    channel.close()


def silence(engine: Engine, grid: Grid) -> None:
    """Stage 1 waits for an array stage 0 never sends: PeerTimeout naming stage 0's rank and the step."""
    if grid.stage(engine.rank) == 1:
        channel = Channel(engine, grid.previous(engine.rank), PipelineTag.ERRORS + 10, timeout=1)
        start = time.monotonic()
        try:
            channel.recv(3)
        except PeerTimeout as exc:
            assert exc.ranks == (engine.rank - 1,) and f"step 3 from rank {engine.rank - 1}" in str(exc), str(exc)
        else:
            raise AssertionError("no PeerTimeout")
        assert 0.9 < time.monotonic() - start < 5
        channel.close()
    engine.barrier()


if __name__ == "__main__":
    from fast_core.engine.mpi import MPIEngine

    world = MPIEngine(timeout=60)
    grid = Grid(world.size, 2)
    for check in (groups, chain, depth, silence):
        check(world, grid)
        world.barrier()
        if world.rank == 0:
            print(f"{check.__name__} ok", flush=True)
