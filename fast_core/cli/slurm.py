"""``fast run --slurm``: launch the ranks inside a SLURM allocation (an ``sbatch`` script, ``salloc``'s shell).

The nodes and tasks come from SLURM's environment (fast_core.config.slurm). By default the ranks start under the
MPI's own mpiexec with a hostfile made from the allocation: inside an allocation MPICH's hydra and Open MPI start
their per-node daemons with ``srun``, so SLURM still starts, tracks and signals every process (``scancel`` ends them
all), and the MPI keeps its own process-management server. ``--slurm-launcher srun`` starts the ranks with
``srun --mpi=pmi2`` (MPICH) or ``--mpi=pmix`` (Open MPI) instead, where the two are known to work together: measured
with the mpich wheel (5.0.2, ch4:ucx) and Debian's Slurm 22.05, 11 of 12 such launches of the NumPy example failed
in MPI_Init (slurmstepd: "mpi/pmi2: value not properly terminated in client request") while mpiexec's 12 of 12 ran.
``--fault-tolerant`` always takes mpiexec: ULFM's detection of a lost process lives in Open MPI's runtime. Either way
each rank runs below FAST's guard, so a lost rank is named. docs/slurm.md says the same for users.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fast_core.cli.common import CLIError, DefaultCount, say
from fast_core.cli.launch import find_mpiexec, find_ulfm_mpiexec, flavour
from fast_core.config.slurm import Allocation, SlurmError, allocation, expand_nodelist
from fast_core.observers.runlog import read_run

PLUGINS = {"hydra": "pmi2", "openmpi": "pmix"}
"""The srun MPI plugin each MPI's ranks can start under (``--slurm-launcher srun``): MPICH's PMI client talks to
SLURM's pmi2 server, Open MPI 5's ranks need PMIx."""
LAUNCHERS = ("mpiexec", "srun")


@dataclass(frozen=True)
class Launch:
    """How the ranks start in the allocation: srun's command line (empty: mpiexec's) and why, in one sentence."""

    srun: tuple[str, ...]
    why: str


def current_allocation() -> Allocation:
    """The allocation ``fast run --slurm`` runs in; one line naming what is wrong outside one or with its text."""
    try:
        found = allocation()
    except SlurmError as error:
        raise CLIError(f"--slurm: {error}") from None
    if found is None:
        raise CLIError(
            "--slurm: not inside a SLURM allocation (no SLURM_JOB_ID): run fast run from an sbatch script or under "
            "salloc, or leave out --slurm"
        )
    return found


def slurm_workers(given: int | None, found: Allocation) -> int:
    """The ranks to start: ``-n`` if given (refused above the tasks allocated, both numbers said), else every task
    SLURM allocated."""
    if given is None:
        return found.total_tasks
    if given > found.total_tasks:
        raise CLIError(
            f"-n {given}: SLURM job {found.job_id} has {found.total_tasks} task(s) allocated "
            f"({tasks_text(found)}); ask for fewer ranks, or for more tasks (sbatch --ntasks / --ntasks-per-node)"
        )
    return given


def tasks_text(found: Allocation) -> str:
    """``fast-h0:1, fast-h1:1``: each node and its tasks."""
    return ", ".join(f"{node}:{tasks}" for node, tasks in zip(found.nodes, found.tasks, strict=True))


def mpi_plugins(srun: str) -> list[str]:
    """The MPI plugins this SLURM offers (``srun --mpi=list``: none, pmi2, pmix, pmix_v4, ...); empty if it does not
    answer."""
    try:
        done = subprocess.run([srun, "--mpi=list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    text = done.stdout + done.stderr
    words = (word.strip(",") for line in text.splitlines() for word in line.split())
    return list(dict.fromkeys(w for w in words if w.startswith(("pmi", "none"))))  # each once, in order


def choose_launch(
    kind: str, plugins: list[str], workers: int, fault_tolerant: bool, srun: str | None, how: str = "mpiexec"
) -> Launch:
    """mpiexec (``how``, the default, and always under ``fault_tolerant``), or srun with the plugin the MPI ``kind``
    speaks, refused in one line when this SLURM does not offer it (see the module's notes)."""
    if fault_tolerant:
        return Launch((), "mpiexec: --fault-tolerant needs Open MPI's runtime (ULFM), which srun-started ranks lack")
    if how == "mpiexec":
        return Launch((), "mpiexec, its per-node daemons started by srun")
    wanted = PLUGINS.get(kind)
    if srun is None or wanted is None or wanted not in plugins:
        offered = ", ".join(plugins) or "none" if srun else "no srun on PATH"
        raise CLIError(
            f"--slurm-launcher srun: the ranks' MPI ({kind}) needs srun --mpi={wanted or '?'}, this SLURM offers "
            f"{offered}; leave out --slurm-launcher to start them with mpiexec"
        )
    command = (srun, f"--mpi={wanted}", "-n", str(workers), "--kill-on-bad-exit=1")
    return Launch(command, f"srun --mpi={wanted}: SLURM starts every rank itself")


def write_hostfile(found: Allocation, kind: str, folder: Path) -> Path:
    """A hostfile of the allocation's nodes and tasks, in the form of ``kind``'s mpiexec (hydra ``node:N``, Open
    MPI ``node slots=N``), in ``folder``."""
    lines = [f"{n}:{t}" if kind == "hydra" else f"{n} slots={t}" for n, t in zip(found.nodes, found.tasks, strict=True)]
    path = folder / "slurm-hosts"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def slurm_arguments(args: argparse.Namespace, folder: Path) -> tuple[int, tuple[str, ...], str]:
    """``fast run --slurm``'s ranks, launcher (empty: mpiexec) and hostfile (written in ``folder``), said in one
    line; ``args.workers`` counts as given unless it is the default (``CPUS``)."""
    if not args.slurm:
        raise CLIError(f"--slurm-launcher {args.slurm_launcher} is for --slurm: add --slurm, or leave it out")
    if args.hostfile:
        raise CLIError("--slurm takes its hosts from the allocation: leave out --hostfile")
    tolerant = bool(args.fault_tolerant or args.max_restarts)
    mpiexec = find_ulfm_mpiexec(args.mpiexec) if tolerant else find_mpiexec(args.mpiexec)
    kind = flavour(mpiexec)
    given = None if isinstance(args.workers, DefaultCount) else args.workers
    found = current_allocation()
    workers = slurm_workers(given, found)
    how = getattr(args, "slurm_launcher", None) or "mpiexec"
    srun = shutil.which("srun") if how == "srun" else None
    launch = choose_launch(kind, mpi_plugins(srun) if srun and not tolerant else [], workers, tolerant, srun, how)
    hostfile = write_hostfile(found, kind, folder)
    say(f"SLURM job {found.job_id}: {workers} of {found.total_tasks} task(s) on {tasks_text(found)}; {launch.why}")
    return workers, launch.srun, str(hostfile)


def nodes_now(job_id: str) -> list[str] | None:
    """The nodes SLURM lists for ``job_id`` now (``scontrol show job``); None if it does not say."""
    try:
        done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(?:^|\s)NodeList=(\S+)", done.stdout)
    try:
        return expand_nodelist(found.group(1)) if found and found.group(1) != "(null)" else None
    except SlurmError:
        return None


def slurm_ending(status: int, run_dir: Path, before: dict[int, int], ending: dict, lines: list[str]) -> int:
    """After a launch under ``--slurm``: the nodes SLURM took from the job while it ran (a node failure under
    ``sbatch --no-kill``) go into ``ending`` ("slurm_lost_nodes") and a line; with such a loss, mpiexec's status 0
    and no rank that closed its worker (records after ``before``) is not a success: PRRTE ends the whole job when
    SLURM kills its daemons' step, and Open MPI's mpiexec under ULFM still says 0 (measured). The status to return."""
    found = allocation()
    now = nodes_now(found.job_id) if found is not None else None
    lost = [node for node in found.nodes if node not in now] if found is not None and now is not None else []
    if not lost:
        return status
    ending["slurm_lost_nodes"] = lost
    closed = any(r["kind"] == "close" for records in read_run(run_dir, before).values() for r in records)
    if status == 0 and not closed:
        status = 1
        ending["survived"] = False
    outcome = "the job went on" if status == 0 else "the job did not finish (no rank closed its worker)"
    lines.append(f"SLURM removed node(s) {', '.join(lost)} from job {found.job_id} (a node failure); {outcome}")
    return status
