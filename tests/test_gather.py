"""fast_core.engine.collectives.gather_arrays / gather_texts: every rank's rows on every rank, bit-exact, in rank
order."""

from __future__ import annotations

import numpy as np

from fast_core.engine.collectives import gather_arrays, gather_texts
from fast_core.engine.local import LocalCluster


def _gather(engine) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
    rows = np.arange(2 * engine.rank, dtype=np.int64).reshape(engine.rank, 2) + 2**60  # rank 0 sends no row
    return gather_arrays(rows, engine), gather_arrays(np.float32(engine.rank + 0.5), engine), gather_texts(
        "é" * engine.rank, engine
    )


def test_every_rank_gets_every_ranks_rows_bit_exact() -> None:
    for rows, scalars, texts in LocalCluster(3, timeout=20).run(_gather):
        assert [part.shape for part in rows] == [(0, 2), (1, 2), (2, 2)]
        np.testing.assert_array_equal(rows[2], np.arange(4, dtype=np.int64).reshape(2, 2) + 2**60)
        assert rows[2][1, 1] == 2**60 + 3  # beyond float64's exact integers
        assert [s.tolist() for s in scalars] == [[0.5], [1.5], [2.5]] and scalars[0].dtype == np.float32
        assert texts == ["", "é", "éé"]


def _mismatched(engine) -> str:
    try:
        gather_arrays(np.zeros((1, 2 + engine.rank)), engine)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_rows_of_different_widths_are_refused_on_every_rank() -> None:
    messages = LocalCluster(2, timeout=20).run(_mismatched)
    assert all("same structure" in m for m in messages), messages
