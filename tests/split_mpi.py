"""Engine.split checked on any engine: imported by tests/test_split_engine.py for LocalCluster, and run under
``mpiexec -n 4 python -m mpi4py tests/split_mpi.py`` for MPIEngine (rank 0 prints one line the test reads; a
failed assertion aborts the job)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fast_core.engine import Engine


def members(engine: Engine, color_of: Callable[[int], int]) -> list[int]:
    """The parent ranks in this rank's group, in parent-rank order."""
    return [r for r in range(engine.size) if color_of(r) == color_of(engine.rank)]


def check_group(engine: Engine, color_of: Callable[[int], int]) -> Engine:
    """Split ``engine`` by ``color_of(rank)`` and check the group: its size and ranks, an allreduce that sums only
    the group's values, a ring of messages inside the group while the parent exchanges on the same tag."""
    group = members(engine, color_of)
    sub = engine.split(color_of(engine.rank))
    assert (sub.size, sub.rank) == (len(group), group.index(engine.rank)), (engine.rank, sub.size, sub.rank, group)
    assert sub.timeout == engine.timeout
    values = np.array([engine.rank + 1.0, 2.0**engine.rank])
    sub.allreduce(values)
    expected = np.array([sum(r + 1.0 for r in group), sum(2.0**r for r in group)])
    assert np.array_equal(values, expected), (engine.rank, values, expected)
    ahead, behind = (engine.rank + 1) % engine.size, (engine.rank - 1) % engine.size
    parent_mine, parent_got = np.array([100 + engine.rank], dtype=np.int64), np.full(1, -1, dtype=np.int64)
    requests = engine.exchange(parent_mine, [behind], [parent_got], [ahead], tag=7)  # the other way round
    after, before = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
    mine, got = np.array([engine.rank], dtype=np.int64), np.full(1, -1, dtype=np.int64)
    if sub.size > 1:
        requests += sub.exchange(mine, [after], [got], [before], tag=7)
    engine.wait_all(requests)
    if sub.size > 1:
        assert got[0] == group[before], (engine.rank, got, group)
    assert parent_got[0] == 100 + ahead, (engine.rank, parent_got)
    return sub


def check_splits(engine: Engine) -> None:
    """Split by rank % 2, then by halves of the job, then the halves by rank % 2: each group works, and the parent
    still sums over everyone after."""
    half = engine.size // 2
    check_group(engine, lambda r: r % 2)
    halves = check_group(engine, lambda r: r // half)
    check_group(halves, lambda r: r % 2)
    total = np.array([float(engine.rank)])
    engine.allreduce(total)
    assert total[0] == engine.size * (engine.size - 1) / 2, total


if __name__ == "__main__":
    from fast_core.engine.mpi import MPIEngine

    world = MPIEngine(timeout=60)
    check_splits(world)
    world.barrier()
    if world.rank == 0:
        print(f"split ok on {world.size} ranks")
