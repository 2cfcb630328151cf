"""Whether a rank's MPI start (MPI_Init) finished, for ``fast run --fault-tolerant``: marks in the run folder.

ULFM lets the survivors of a lost rank go on once MPI is running, but MPI_Init itself waits for every process of
the launch: a rank lost before it (killed while importing, say) leaves the others waiting there for ever, with no
error to catch. So ``fast_core.init()`` marks, under ``fast run``, that this process starts MPI
(``RUN_DIR/starting/<pid>``) and that it started it (``<pid>.started``). The launcher, seeing a guard's record of a
lost process with no ``started`` mark while others still wait in their start, knows the job cannot start: it stops
it, names the rank, and launches it again when ``--max-restarts`` allows (nothing was trained yet).
"""

from __future__ import annotations

import os
from pathlib import Path

STARTING = "starting"
"""The run folder's subfolder of the start marks (cleared by each launch)."""
STARTED = ".started"


def mark_starting(run_dir: Path) -> None:
    """This process is about to start MPI (a folder we cannot write is no error: the mark is a help, not a need)."""
    _touch(Path(run_dir) / STARTING / str(os.getpid()))


def mark_started(run_dir: Path) -> None:
    """This process's MPI is running: from now a loss of it is one the others can survive."""
    _touch(Path(run_dir) / STARTING / f"{os.getpid()}{STARTED}")


def _touch(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def start_marks(run_dir: Path) -> tuple[set[int], set[int]]:
    """(pids that began starting MPI, pids that finished) in ``run_dir``."""
    began, done = set(), set()
    for path in (Path(run_dir) / STARTING).glob("*"):
        name = path.name.removesuffix(STARTED)
        if name.isdigit():
            (done if path.name.endswith(STARTED) else began).add(int(name))
    return began, done


def lost_before_start(run_dir: Path, lost_pid: int) -> bool:
    """Whether a lost process (``lost_pid``, its guard's record) never finished its MPI start while another one is
    still in its own: then the job cannot start. False where no process marks its start (a script that does not
    call ``fast_core.init()``): nothing is known."""
    began, done = start_marks(run_dir)
    return lost_pid not in done and bool(began - done - {lost_pid})
