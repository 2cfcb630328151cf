"""Where benchmarks put their results: one marked section each in docs/benchmarks.md, the rest kept as it is."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

TITLE = "# FAST benchmarks"
PREAMBLE = (
    "Each benchmark times FAST and its baseline side by side in the same run, interleaved iteration by iteration, "
    "so machine noise hits both alike: read the ratios, not the absolute numbers, which vary from machine to "
    "machine and run to run."
)


def markers(name: str) -> tuple[str, str]:
    """The comment lines that delimit benchmark ``name``'s section."""
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_section(path: Path, name: str, text: str) -> None:
    """Replace benchmark ``name``'s section (``text`` includes its markers) in ``path``, or append it; create the
    file with the title and preamble if needed."""
    start, end = markers(name)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{TITLE}\n\n{PREAMBLE}\n\n{text}\n")
        return
    old = path.read_text()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    new = pattern.sub(lambda _: text, old, count=1) if pattern.search(old) else f"{old.rstrip()}\n\n{text}\n"
    path.write_text(new)


def command_line(ranks: int | None) -> str:
    """The command that produced this run, for the section's header (``ranks=None``: a plain python process)."""
    env = "OMP_NUM_THREADS=1 " if os.environ.get("OMP_NUM_THREADS") == "1" else ""
    launcher = "python" if ranks is None else f"mpiexec -n {ranks} python -m mpi4py"
    return f"{env}{launcher} {' '.join(sys.argv)}"


def gather_to_root(comm, values: Sequence[float]) -> np.ndarray | None:
    """Every rank's ``values`` as rows of a float64 table on rank 0 (None elsewhere): numbers, never a pickle."""
    mine = np.asarray(values, dtype=np.float64)
    table = np.empty((comm.Get_size(), mine.size)) if comm.Get_rank() == 0 else None
    comm.Gather(mine, table, root=0)
    return table
