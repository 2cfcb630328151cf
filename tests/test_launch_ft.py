"""`fast run --fault-tolerant` (issue 13, point 1, the launcher's side): Open MPI built with ULFM found and checked,
its command line, FAST_FAULT_TOLERANT in the run configuration and the engine it chooses, and how a job ends when a
rank is lost and the others go on.

The real launches need an Open MPI mpiexec built with ULFM (the `mpi-ft` extra's): the one named by
FAST_TEST_OMPI_MPIEXEC, else the one next to this Python; they are skipped, saying so, when there is none.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from fast_cli import FAST, fast

import fast_core
import fast_core.engine.mpi as mpi_module
from fast_core import ConfigError
from fast_core.cli import launch
from fast_core.cli.endings import job_ending, joined_ranks
from fast_core.cli.launch import Job, find_ulfm_mpiexec, ulfm_missing
from fast_core.cli.run import launch_variables
from fast_core.config.run import RunConfig
from fast_core.engine import default_engine, mpi_engine, ulfm_problem
from fast_core.runtime import process
from fast_core.runtime.startup import STARTING, lost_before_start
from fast_core.runtime.uncaught import cause_of

OPEN_MPI = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11"
MPICH = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026"


# the command line ------------------------------------------------------------------------------------------------


def _ft_job(monkeypatch, tmp_path: Path, *, root: bool, cpus: int = 2, workers: int = 4) -> Job:
    """A fault-tolerant Job whose mpiexec is Open MPI with ULFM, as far as the launcher can tell."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "venv" / "lib").mkdir()
    (tmp_path / "venv" / "lib" / "libmpi.so.40").write_text("")
    monkeypatch.setattr(launch, "find_ulfm_mpiexec", lambda explicit=None: str(bin_dir / "mpiexec"))
    monkeypatch.setattr(launch, "flavour", lambda mpiexec: "openmpi")
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    monkeypatch.delenv("MPI4PY_LIBMPI", raising=False)
    variables = launch_variables(RunConfig(fault_tolerant=True))
    return Job(
        ["python", "-m", "mpi4py", "train.py"], workers, variables, exits=tmp_path / "exits", fault_tolerant=True
    )


@pytest.mark.parametrize("root", [True, False], ids=["root", "user"])
def test_the_fault_tolerant_command_line_asks_for_ulfm_and_lets_root_run_only_as_root(
    monkeypatch, tmp_path: Path, root: bool
) -> None:
    command, env = _ft_job(monkeypatch, tmp_path, root=root).command()
    joined = " ".join(command)
    assert " --with-ft ulfm " in joined
    assert ("--allow-run-as-root" in command) == root
    assert "--oversubscribe" in command  # 4 ranks, 2 cores
    assert "-x FAST_FAULT_TOLERANT" in joined and env["FAST_FAULT_TOLERANT"] == "1"
    assert env["MPI4PY_LIBMPI"] == str(tmp_path / "venv" / "lib" / "libmpi.so.40")  # not an MPICH beside it
    guard = command.index(str(launch.GUARD))
    assert command[guard + 1 : guard + 3] == [str(tmp_path / "exits"), "--"]  # every rank below its guard
    assert command[-4:] == ["python", "-m", "mpi4py", "train.py"]
    assert command.index("--with-ft") < guard


def test_without_fault_tolerance_open_mpi_gets_no_ft_flag_and_no_oversubscribe_within_the_cores(
    monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(launch, "find_mpiexec", lambda explicit=None: "/opt/ompi/bin/mpiexec")
    monkeypatch.setattr(launch, "flavour", lambda mpiexec: "openmpi")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    command, _ = Job(["python", "train.py"], 4, exits=tmp_path / "exits").command()
    assert "--with-ft" not in command and "--oversubscribe" not in command
    assert str(launch.GUARD) in command  # the guard names a lost rank under Open MPI too


def test_a_fault_tolerant_job_needs_the_guards_records() -> None:
    with pytest.raises(ValueError, match="needs exits"):
        Job(["python", "train.py"], 2, fault_tolerant=True)


# finding a ULFM mpiexec, or refusing on one line -------------------------------------------------------------------


def _fake_mpiexec(folder: Path, version: str, ft_support: str | None) -> Path:
    """An executable ``mpiexec`` printing ``version``, with an ``ompi_info`` beside it when ``ft_support`` is given."""
    folder.mkdir(parents=True, exist_ok=True)
    mpiexec = folder / "mpiexec"
    mpiexec.write_text(f"#!/bin/sh\necho '{version}'\n")
    mpiexec.chmod(0o755)
    if ft_support is not None:
        info = folder / "ompi_info"
        info.write_text(
            f"#!/bin/sh\necho 'options:ft_support:{ft_support}'\necho 'options:ft_mpi_support:{ft_support}'\n"
        )
        info.chmod(0o755)
    return mpiexec


def test_the_first_ulfm_mpiexec_is_found_next_to_python_or_on_path(monkeypatch, tmp_path: Path) -> None:
    hydra = _fake_mpiexec(tmp_path / "venv" / "bin", "HYDRA build details:", None)
    plain = _fake_mpiexec(tmp_path / "plain", "mpiexec (Open MPI) 5.0.11", "no")
    ulfm = _fake_mpiexec(tmp_path / "ulfm", "mpiexec (Open MPI) 5.0.11", "yes")
    monkeypatch.setattr(sys, "executable", str(hydra.parent / "python"))
    monkeypatch.setenv("PATH", os.pathsep.join(str(p.parent) for p in (hydra, plain, ulfm)))
    assert find_ulfm_mpiexec() == str(ulfm)
    assert ulfm_missing(str(hydra)) == "MPICH's hydra"
    assert "without ULFM" in ulfm_missing(str(plain))
    with pytest.raises(launch.CLIError) as refused:  # --mpiexec: that one, or a refusal
        find_ulfm_mpiexec(str(plain))
    assert f"{plain} (Open MPI built without ULFM (ompi_info: FT MPI support: no))" in str(refused.value)


def test_fast_run_refuses_without_a_ulfm_mpiexec_on_one_line_naming_the_fix(tmp_path: Path) -> None:
    hydra = _fake_mpiexec(tmp_path / "bin", "HYDRA build details:", None)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    done = fast(
        "run", "-n", "2", "--fault-tolerant", "--mpiexec", str(hydra), "--run-dir", str(tmp_path / "r"), str(script)
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fast: error: --fault-tolerant needs Open MPI's mpiexec built with ULFM:")
    assert f"{hydra} (MPICH's hydra)" in lines[0]
    assert "pip install 'fast-training[mpi-ft]'" in lines[0]


# the run configuration and the engine it chooses -------------------------------------------------------------------


def test_fast_fault_tolerant_is_read_once_checked_and_round_trips() -> None:
    assert RunConfig.from_environment({"FAST_FAULT_TOLERANT": "1"}).fault_tolerant is True
    assert RunConfig.from_environment({"FAST_FAULT_TOLERANT": "0"}).fault_tolerant is False
    assert RunConfig.from_environment({}).fault_tolerant is False
    with pytest.raises(ConfigError, match=r"^FAST_FAULT_TOLERANT='maybe': give 1 \(yes\) or 0 \(no\)$"):
        RunConfig.from_environment({"FAST_FAULT_TOLERANT": "maybe"})
    config = RunConfig(fault_tolerant=True)
    assert RunConfig.from_environment({"FAST_FAULT_TOLERANT": "0", **config.to_environment()}) == config


class _FakeMPI:
    """What mpi_engine asks of mpi4py's MPI before it builds an engine."""

    def __init__(self, version: str, rank: int = 3) -> None:
        self.version = version
        self.COMM_WORLD = types.SimpleNamespace(Get_rank=lambda: rank)

    def Get_library_version(self) -> str:
        return self.version


@pytest.fixture
def engines(monkeypatch):
    """Both MPI engine classes replaced by recorders (no MPI library is loaded), and an
    environment that looks like 4 ranks under mpiexec."""
    made = []

    def recorder(name):
        return lambda comm=None, timeout=None, max_restarts=0, max_ranks=0: made.append((name, comm, timeout)) or name

    monkeypatch.setattr(mpi_module, "MPIEngine", recorder("MPIEngine"))
    fake_ft = types.ModuleType("fast_core.engine.mpi_ft")
    fake_ft.FaultTolerantMPIEngine = recorder("FaultTolerantMPIEngine")
    monkeypatch.setitem(sys.modules, "fast_core.engine.mpi_ft", fake_ft)
    monkeypatch.setattr(mpi_module, "_mpi", lambda: _FakeMPI(OPEN_MPI))
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    for name in ("PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    return made


def test_the_default_engine_is_the_fault_tolerant_one_when_the_configuration_says_so(monkeypatch, engines) -> None:
    monkeypatch.setenv("FAST_FAULT_TOLERANT", "1")
    monkeypatch.setenv("FAST_TIMEOUT", "5")
    monkeypatch.setenv("OMPI_MCA_mpi_ft_enable", "1")
    monkeypatch.setattr(process, "_engine", None)  # this process's engine is not made yet (restored after)
    assert fast_core.init() == "FaultTolerantMPIEngine"  # init reads the configuration and gives its numbers
    assert default_engine(timeout=5, fault_tolerant=True) == "FaultTolerantMPIEngine"
    monkeypatch.setenv("FAST_FAULT_TOLERANT", "0")
    assert default_engine(timeout=5) == "MPIEngine"  # an engine never reads the environment: the values given
    assert mpi_engine("comm", 7, fault_tolerant=True) == "FaultTolerantMPIEngine"
    assert engines == [
        ("FaultTolerantMPIEngine", None, 5),
        ("FaultTolerantMPIEngine", None, 5),
        ("MPIEngine", None, 5),
        ("FaultTolerantMPIEngine", "comm", 7),
    ]


@pytest.mark.parametrize(
    "version, ft_enable, words",
    [
        (MPICH, "1", "the MPI library loaded is MPICH Version: 5.0.2"),
        (OPEN_MPI, "", "Open MPI v5.0.11 was started without --with-ft ulfm"),
    ],
    ids=["mpich", "open-mpi-without-ft"],
)
def test_fault_tolerance_under_another_mpi_is_refused_naming_the_rank_and_the_fix(
    monkeypatch, engines, version: str, ft_enable: str, words: str
) -> None:
    monkeypatch.setenv("FAST_FAULT_TOLERANT", "1")
    monkeypatch.setenv("OMPI_MCA_mpi_ft_enable", ft_enable)
    monkeypatch.setattr(mpi_module, "_mpi", lambda: _FakeMPI(version))
    with pytest.raises(ConfigError) as refused:
        default_engine(fault_tolerant=fast_core.run_config().fault_tolerant)
    message = str(refused.value)
    assert message.startswith("rank 3: FAST_FAULT_TOLERANT=1 needs Open MPI with ULFM") and "\n" not in message
    assert words in message and "fast run --fault-tolerant" in message
    assert engines == []


def test_ulfm_problem_reads_the_library_and_the_launch() -> None:
    assert ulfm_problem(OPEN_MPI, {"OMPI_MCA_mpi_ft_enable": "1"}) is None
    assert "MPICH" in ulfm_problem(MPICH, {"OMPI_MCA_mpi_ft_enable": "1"})
    assert "without --with-ft ulfm" in ulfm_problem(OPEN_MPI, {})


# how a fault-tolerant job ends, from the guards' records ------------------------------------------------------------


def _ended(tmp_path: Path, *endings: tuple[int, str | None, int, float], step: int | None = None) -> Path:
    """A run folder whose guards recorded ``endings`` (rank, signal, status, wall), each rank at ``step``."""
    exits = tmp_path / "exits"
    exits.mkdir()
    for rank, sig, status, wall in endings:
        ended = {"rank": rank, "pid": 100 + rank, "host": "h", "signal": sig, "status": status, "wall": wall}
        (exits / f"rank{rank}.json").write_text(json.dumps(ended))
        if step is not None:
            start = {"kind": "start", "rank": rank, "step": 0, "time": 0.0, "wall_start": wall - 2.0}
            last = {"kind": "step", "rank": rank, "step": step, "time": 1.5}
            (tmp_path / f"rank{rank}.jsonl").write_text(f"{json.dumps(start)}\n{json.dumps(last)}\n")
    return tmp_path


def _job(workers: int = 4, aborted: dict | None = None, fault_tolerant: bool = True, kind: str = "openmpi"):
    return types.SimpleNamespace(
        workers=workers, stopped_by=0, aborted=aborted, fault_tolerant=fault_tolerant, kind=kind, unstartable=None
    )


def test_a_rank_lost_while_the_others_finish_is_named_with_its_step_and_the_job_succeeds(tmp_path: Path) -> None:
    run_dir = _ended(tmp_path, (2, "SIGKILL", -9, 100.0), step=7)
    status, ending, lines = job_ending(0, _job(), run_dir)
    assert status == 0 and ending["survived"] is True
    assert [(e["rank"], e["step"], e["signal"]) for e in ending["lost_ranks"]] == [(2, 7, "SIGKILL")]
    assert lines == [
        "rank 2 (pid 102, host h) was killed by SIGKILL at step 7 or a little after (its last record, written 0.50 s "
        "before); the 3 other ranks went on without it and finished"
    ]


def test_a_job_where_every_rank_was_lost_fails_although_mpiexec_said_0(tmp_path: Path) -> None:
    run_dir = _ended(tmp_path, *((r, "SIGKILL", -9, 100.0 + r) for r in range(4)))
    status, ending, lines = job_ending(0, _job(), run_dir)
    assert status == 128 + 9 and ending["survived"] is False and ending["lost"]["rank"] == 0
    assert len(lines) == 1 and lines[0].startswith("every one of the 4 ranks was lost: rank 0 (pid 100, host h)")


def test_a_replaced_rank_is_named_from_its_own_records_and_the_job_succeeds(tmp_path: Path) -> None:
    """--max-restarts: the replacement appends its records to the lost rank's log, and Open MPI's launcher says 137
    once it spawned one; the lost process's own last step is named, the replacement said, and the job succeeds."""
    run_dir = _ended(tmp_path, (2, "SIGKILL", -9, 100.0), step=7)
    log = run_dir / "rank2.jsonl"
    replacement = [
        {"kind": "start", "rank": 2, "step": 9, "time": 0.0, "wall_start": 101.0, "pid": 999},
        {"kind": "step", "rank": 2, "step": 30, "time": 3.0},
        {"kind": "close", "rank": 2, "step": 31},
    ]
    membership = {"kind": "membership", "rank": 0, "step": 9, "lost": "2", "replaced": "2"}
    log.write_text(log.read_text() + "".join(json.dumps(r) + "\n" for r in replacement))
    (run_dir / "rank0.jsonl").write_text(json.dumps(membership) + "\n")
    status, ending, lines = job_ending(137, _job(), run_dir)
    assert status == 0 and ending["survived"] is True and ending["replaced"] == [2] and ending["mpiexec_status"] == 137
    assert [(e["rank"], e["step"]) for e in ending["lost_ranks"]] == [(2, 7)]
    assert lines[0].endswith("new processes took over rank(s) [2] and the job finished")


def test_a_rank_that_left_over_a_nan_is_named_with_its_error_and_the_job_succeeds(tmp_path: Path) -> None:
    run_dir = _ended(tmp_path, (2, "SIGKILL", -9, 100.0), step=7)
    error = "NonFiniteError: rank 2's parameters hold NaN or Inf at step 7; it stops rather than send them"
    (run_dir / "errors").mkdir()
    left = {"rank": 2, "pid": 102, "error": error, "left": True, "wall": 99.9}
    (run_dir / "errors" / "rank2.102.json").write_text(json.dumps(left))
    other = {**left, "pid": 999, "error": "NonFiniteError: a later process of rank 2"}  # another incarnation's
    (run_dir / "errors" / "rank2.999.json").write_text(json.dumps(other))
    status, ending, lines = job_ending(0, _job(), run_dir)
    assert status == 0 and ending["survived"] is True and ending["lost_ranks"][0]["left"] == error
    assert lines[0].startswith(f"rank 2 (pid 102, host h) left the group ({error}) at step 7")
    assert cause_of([left])["left"]  # only when alone
    later = {"rank": 1, "error": "ValueError: bad", "left": False, "wall": 200.0}
    assert cause_of([{"rank": 2, "error": error, "left": True, "wall": 99.9}, later]) == later  # never the cause


def test_a_job_that_grew_succeeds_although_open_mpi_says_1(tmp_path: Path) -> None:
    """Open MPI's launcher ends with status 1 once ranks spawned workers that asked to join; nobody was lost."""
    membership = {"kind": "membership", "rank": 0, "step": 9, "lost": "", "replaced": "", "joined": "4"}
    closed = {"kind": "close", "rank": 0, "step": 40}
    (tmp_path / "rank0.jsonl").write_text(json.dumps(membership) + "\n" + json.dumps(closed) + "\n")
    status, ending, lines = job_ending(1, _job(), tmp_path)
    assert (status, ending, lines) == (0, {"lost_ranks": [], "mpiexec_status": 1}, [])
    assert joined_ranks(tmp_path) == [4]


def test_a_rank_that_exits_with_an_error_is_never_survived(tmp_path: Path) -> None:
    run_dir = _ended(tmp_path, (2, "SIGKILL", -9, 100.0), (1, None, 3, 105.0), (0, "SIGTERM", -15, 106.0))
    aborted = json.loads((run_dir / "exits" / "rank1.json").read_text())
    status, ending, lines = job_ending(3, _job(aborted=aborted), run_dir)
    assert status == 3 and ending["survived"] is False and ending["lost"]["rank"] == 1
    assert [e["rank"] for e in ending["lost_ranks"]] == [2, 1]  # rank 0 was stopped by fast run, not lost
    assert lines == [
        "rank 1 (pid 101, host h) exited with status 3; fast run stopped the other ranks (under ULFM, "
        "Open MPI's MPI_Abort does not)"
    ]


def test_without_fault_tolerance_the_first_lost_rank_is_named_as_before(tmp_path: Path) -> None:
    run_dir = _ended(tmp_path, (2, "SIGKILL", -9, 100.0), (1, "SIGTERM", -15, 101.0))
    status, ending, lines = job_ending(137, _job(fault_tolerant=False), run_dir)
    assert status == 137 and set(ending) == {"lost"} and ending["lost"]["rank"] == 2
    assert lines[0].endswith(
        "mpiexec stopped the other ranks (the PID in Open MPI's banner above is the rank's guard's)"
    )


# real launches under Open MPI with ULFM ----------------------------------------------------------------------------


def _ulfm_mpiexec() -> str:
    """FAST_TEST_OMPI_MPIEXEC (which must then be one), else the mpiexec next to this Python if it is Open MPI with
    ULFM; skips the test otherwise."""
    named = os.environ.get("FAST_TEST_OMPI_MPIEXEC")
    if named:
        problem = ulfm_missing(named) if Path(named).is_file() else "no such file"
        if problem:
            pytest.fail(f"FAST_TEST_OMPI_MPIEXEC={named}: {problem}")
        return named
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and ulfm_missing(str(here)) is None:
        return str(here)
    pytest.skip(
        f"no Open MPI mpiexec built with ULFM next to {sys.executable}: install the mpi-ft extra there, or set "
        "FAST_TEST_OMPI_MPIEXEC to one (this Python's mpi4py must be able to load its libmpi)"
    )


SURVIVOR = """
import os, signal, sys, time
import numpy as np
from mpi4py import MPI
from fast_core.observers.runlog import RunLog, rank_file

comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
rank = comm.Get_rank()
log = RunLog(rank_file(os.environ["FAST_RUN_DIR"], rank))
log.write({"kind": "start", "rank": rank, "step": 0, "time": 0.0, "wall_start": time.time()})
log.write({"kind": "step", "rank": rank, "step": 7, "time": 0.0})
comm.Barrier()
victims = {"one": [2], "all": [0, 1, 2, 3], "error": []}[sys.argv[1]]
if rank in victims:
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "error" and rank == 1:
    raise SystemExit(3)  # under -m mpi4py: MPI_Abort(3), which ULFM does not spread to the others
ones, total = np.ones(1), np.zeros(1)
try:
    comm.Allreduce(ones, total)
except MPI.Exception:
    comm.Revoke()
    comm = comm.Shrink()
    comm.Allreduce(ones, total)
print(f"survivor {rank}: {comm.Get_size()} ranks, sum {total[0]:g}", flush=True)
"""


def _launch(tmp_path: Path, case: str) -> tuple[subprocess.CompletedProcess, dict]:
    mpiexec = _ulfm_mpiexec()
    script = tmp_path / "survivor.py"
    script.write_text(SURVIVOR)
    run_dir = tmp_path / "r"
    command = [*FAST, "run", "-n", "4", "--no-progress", "--fault-tolerant", "--mpiexec", mpiexec]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [*command, "--run-dir", str(run_dir), str(script), case], capture_output=True, text=True, timeout=120, env=env
    )
    return done, json.loads((run_dir / "run.json").read_text())


@pytest.mark.mpi
def test_a_rank_killed_under_fast_run_fault_tolerant_is_survived_and_named(tmp_path: Path) -> None:
    done, run = _launch(tmp_path, "one")
    assert done.returncode == 0, done.stderr
    survivors = re.findall(r"^\[(\d)\] survivor (\d): 3 ranks, sum 3$", done.stdout, re.M)  # their rank in front
    assert sorted(survivors) == [("0", "0"), ("1", "1"), ("3", "3")], done.stdout
    assert re.search(
        r"rank 2 \(pid \d+, host \S+\) was killed by SIGKILL at step 7 .*; the 3 other ranks went on without it",
        done.stderr,
    ), done.stderr
    assert run["survived"] is True and run["exit_status"] == 0
    assert [(e["rank"], e["step"]) for e in run["lost_ranks"]] == [(2, 7)]


@pytest.mark.mpi
@pytest.mark.parametrize("case, status", [("all", 128 + 9), ("error", 3)])
def test_a_fault_tolerant_job_still_fails_when_everybody_died_or_a_rank_failed(
    tmp_path: Path, case: str, status: int
) -> None:
    done, run = _launch(tmp_path, case)  # "error" hung until killed before fast run stopped it (ULFM's Abort)
    assert done.returncode == status, done.stderr
    assert run["survived"] is False and run["exit_status"] == status
    if case == "all":
        assert "every one of the 4 ranks was lost" in done.stderr
    else:
        assert re.search(r"rank 1 \(pid \d+, host \S+\) exited with status 3 at step 7", done.stderr), done.stderr


def test_a_rank_lost_with_its_guard_is_named_from_the_survivors_records(tmp_path: Path) -> None:
    """A guard killed on its own takes its rank along and records nothing: the survivors' "membership" records name
    the loss, the lost process's "start" record its pid and host, and the job that recovered succeeds (issue 31:
    fast run returned 1 with "lost_ranks": [])."""
    (tmp_path / "exits").mkdir()
    lost = [
        {"kind": "start", "rank": 2, "step": 0, "time": 0.0, "wall_start": 98.0, "pid": 802, "host": "h2"},
        {"kind": "step", "rank": 2, "step": 7, "time": 1.5},
        {"kind": "start", "rank": 2, "step": 9, "time": 0.0, "wall_start": 101.0, "pid": 999, "host": "h2"},
        {"kind": "close", "rank": 2, "step": 31},
    ]
    (tmp_path / "rank2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lost))
    for rank, detected in ((0, 100.2), (1, 100.1)):
        seen = {"kind": "membership", "rank": rank, "step": 9, "lost": "2", "replaced": "2", "detected_at": detected}
        (tmp_path / f"rank{rank}.jsonl").write_text(json.dumps(seen) + "\n")
    status, ending, lines = job_ending(137, _job(), tmp_path)
    assert status == 0 and ending["survived"] is True and ending["replaced"] == [2]
    assert [(e["rank"], e["pid"], e["step"], e["wall"]) for e in ending["lost_ranks"]] == [(2, 802, 7, 100.1)]
    assert lines[0].startswith(
        "rank 2 (pid 802, host h2) was lost with no record of how it ended (its guard, the process fast run starts "
        "above it, died too) at step 7"
    ), lines


LOST_BEFORE_MPI = """
import os, signal, sys, time
from pathlib import Path

once = Path(sys.argv[1])
if os.environ.get("OMPI_COMM_WORLD_RANK") == "2" and not once.exists():
    once.write_text("lost")
    time.sleep(1.0)  # the others are waiting in their MPI start by then
    os.kill(os.getpid(), signal.SIGKILL)
import fast_core

engine = fast_core.init()
print(f"started {engine.rank} of {engine.size}", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("restarts", [0, 1])
def test_a_rank_lost_before_mpi_starts_ends_the_job_or_starts_it_again(tmp_path: Path, restarts: int) -> None:
    """MPI_Init waits for every process, so a rank lost before it leaves the others there for ever (issue 31: past
    300 s, no message): fast run stops them and names the rank, or launches the job again under --max-restarts."""
    mpiexec = _ulfm_mpiexec()
    script = tmp_path / "early.py"
    script.write_text(LOST_BEFORE_MPI)
    run_dir = tmp_path / "r"
    command = [*FAST, "run", "-n", "4", "--no-progress", "--fault-tolerant", "--mpiexec", mpiexec]
    command += ["--max-restarts", str(restarts), "--run-dir", str(run_dir), str(script), str(tmp_path / "once")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    run = json.loads((run_dir / "run.json").read_text())
    if restarts == 0:
        assert done.returncode == 128 + 9 and run["before_mpi_start"] is True and run["lost"]["rank"] == 2
        said = r"rank 2 \(pid \d+, host \S+\) was killed by SIGKILL before its MPI start finished"
        assert re.search(said, done.stderr), done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert sorted(re.findall(r"started (\d) of 4", done.stdout)) == ["0", "1", "2", "3"], done.stdout
        assert [e["rank"] for e in run["relaunched_after"]] == [2] and run["exit_status"] == 0
        assert "before its MPI start: the job starts again (0 restart(s) left)" in done.stderr


def test_a_loss_before_the_mpi_start_is_told_by_the_start_marks(tmp_path: Path) -> None:
    """Only a lost process that never finished its MPI start, while another still waits in its own, stops the job;
    a script that marks nothing (no fast_core.init()) is never stopped on a guess."""
    marks = tmp_path / STARTING

    def mark(*names: str) -> None:
        shutil.rmtree(marks, ignore_errors=True)
        marks.mkdir()
        for name in names:
            (marks / name).touch()

    assert not lost_before_start(tmp_path, 101)  # no marks at all
    mark("102")
    assert lost_before_start(tmp_path, 101)  # lost before it even marked; 102 waits
    mark("101", "102")
    assert lost_before_start(tmp_path, 101)
    mark("101", "101.started", "102")
    assert not lost_before_start(tmp_path, 101)  # its MPI ran: a loss ULFM survives
    mark("101", "102", "102.started")
    assert not lost_before_start(tmp_path, 101)  # nobody waits in a start


FREEZES = """
import os, signal
import numpy as np
import fast_core
from fast_core import Budget
from fast_core.model.numpy_model import SGD, SoftmaxRegression

engine = fast_core.init()
model = SoftmaxRegression(4, 2, optimizer=SGD(0.1), seed=engine.rank)
worker = fast_core.Worker(model, "dpsgd:ring", engine, budget=Budget(samples=4000)).start()
while (granted := worker.claim_batch(8)):
    if engine.rank == 2 and worker.step == 20:
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen, not dead: ULFM alone would never declare it failed
    model.compute_gradients(np.ones((granted, 4)), np.arange(granted) % 2)
    worker.run_step(model.optimizer_step)
worker.close()
print(f"finished {worker.group.average_params().size} of {engine.size}", flush=True)
"""


@pytest.mark.mpi
def test_a_frozen_rank_is_killed_by_its_guard_and_survived(tmp_path: Path) -> None:
    """SIGSTOP under --fault-tolerant: after --freeze-timeout without a heartbeat the guard kills the rank, ULFM
    declares it failed, the others go on, and fast run names it frozen (issue 31: the job ended after FAST_TIMEOUT)."""
    mpiexec = _ulfm_mpiexec()
    script = tmp_path / "freezes.py"
    script.write_text(FREEZES)
    run_dir = tmp_path / "r"
    command = [*FAST, "run", "-n", "4", "--no-progress", "--fault-tolerant", "--freeze-timeout", "3"]
    command += ["--mpiexec", mpiexec, "--run-dir", str(run_dir), str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", FAST_TIMEOUT="60")
    done = subprocess.run(command, capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(re.findall(r"^\[(\d)\] finished 10 of 3$", done.stdout, re.M)) == ["0", "1", "3"], done.stdout
    frozen = r"rank 2 \(pid \d+, host \S+\) froze \(no heartbeat for 3 s\) and was killed by its guard"
    assert re.search(frozen, done.stderr), done.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["survived"] is True and [(e["rank"], e["frozen"]) for e in run["lost_ranks"]] == [(2, 3.0)]
