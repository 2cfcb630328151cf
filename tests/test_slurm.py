"""``fast run --slurm`` without a SLURM (issue 27): SLURM's nodelist and tasks-per-node forms, the allocation read
from its environment, each rank's local rank from its srun step, the launcher chosen and its command line, and the
user's mistakes as one line each. The real SLURM's tests are in test_slurm_cluster.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fast_core.cli import launch, slurm
from fast_core.cli import main as fast_main
from fast_core.cli.common import CLIError
from fast_core.cli.launch import GUARD, Job
from fast_core.config.slurm import SlurmError, allocation, expand_nodelist, expand_tasks, step_placement

SBATCH_ENV = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NODELIST": "fast-h[0-3]",
    "SLURM_TASKS_PER_NODE": "1(x4)",
    "SLURM_CPUS_PER_TASK": "1",
}
"""What an sbatch script of 4 nodes, one task each, sees (as slurmd 22.05 writes it)."""


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node07", ["node07"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("gpu-[1-2]-[a,b]", ["gpu-1-a", "gpu-1-b", "gpu-2-a", "gpu-2-b"]),
        ("a[8-10],b1,c[001-002]", ["a8", "a9", "a10", "b1", "c001", "c002"]),
        ("fast-h[0-1],login.cluster", ["fast-h0", "fast-h1", "login.cluster"]),
    ],
)
def test_nodelists_expand_in_slurms_order_keeping_the_zero_padding(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text, part", [("node[1-", "does not pair"), ("node[a-b]", "'a-b'"), ("n]1", "does not pair"),
                                        ("node[4-2]", "'4-2'"), ("a,,b", "name is empty"), (" ", "empty")])
def test_a_nodelist_that_cannot_be_read_is_named_with_the_form_expected(text: str, part: str) -> None:
    with pytest.raises(SlurmError, match="expected names and bracketed ranges") as error:
        expand_nodelist(text)
    assert repr(text) in str(error.value) and part in str(error.value)


def test_tasks_per_node_expand_repeats_and_name_a_bad_item() -> None:
    assert expand_tasks("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks("4") == [4]
    with pytest.raises(SlurmError, match=r"tasks per node '2\(3\)': cannot read '2\(3\)'; expected counts"):
        expand_tasks("2(3)")


def test_the_allocation_is_read_from_sbatchs_environment_and_none_outside_one() -> None:
    found = allocation(SBATCH_ENV)
    assert (found.job_id, found.nodes, found.tasks, found.total_tasks) == ("42", ("fast-h0", "fast-h1", "fast-h2",
                                                                                "fast-h3"), (1, 1, 1, 1), 4)
    assert found.cpus_per_task == 1 and found.gpus is None
    assert allocation({"SLURM_GPUS_PER_TASK": "1", **SBATCH_ENV}).gpus == "SLURM_GPUS_PER_TASK=1"
    assert allocation({"PATH": "/bin"}) is None
    with pytest.raises(SlurmError, match="gives 2 node\\(s\\).*names 4"):
        allocation({**SBATCH_ENV, "SLURM_TASKS_PER_NODE": "2(x2)"})


def test_srun_tells_each_rank_its_local_rank_but_an_inherited_batch_step_is_not_believed() -> None:
    step = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2(x3)"}
    assert step_placement(5, 6, step) == (1, 2)
    batch = {**step, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}  # what mpiexec's ranks inherit
    assert step_placement(3, 6, batch) is None
    assert step_placement(5, 6, {**step, "SLURM_STEP_TASKS_PER_NODE": "x"}) is None


@pytest.mark.parametrize(
    "env, args, message",
    [
        ({}, ["-n", "2"], "--slurm: not inside a SLURM allocation (no SLURM_JOB_ID): run fast run from an sbatch"),
        ({**SBATCH_ENV, "SLURM_JOB_NODELIST": "fast-h[0-3"}, ["-n", "2"],
         "--slurm: nodelist 'fast-h[0-3': a bracket does not pair or a name is empty; expected names and "),
        (SBATCH_ENV, ["-n", "6"], "-n 6: SLURM job 42 has 4 task(s) allocated (fast-h0:1, fast-h1:1, fast-h2:1, "
                                  "fast-h3:1); ask for fewer ranks"),
        (SBATCH_ENV, ["--hostfile", "hosts"], "--slurm takes its hosts from the allocation: leave out --hostfile"),
        (SBATCH_ENV, ["--slurm-launcher", "srun", "--no-slurm"], "--slurm-launcher srun is for --slurm: add --slurm"),
    ],
)
def test_slurm_mistakes_are_one_line_and_status_2(tmp_path: Path, monkeypatch, capsys, env, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "x.py").write_text("print('never run')\n")
    with pytest.raises(SystemExit) as exit_:
        slurm_flag = [] if "--no-slurm" in args else ["--slurm"]
        fast_main(["run", *slurm_flag, *[a for a in args if a != "--no-slurm"], "x.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("fast: error: ") and message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_mpiexec_is_the_default_and_srun_takes_the_plugin_the_mpi_speaks_or_is_refused_in_one_line() -> None:
    assert slurm.choose_launch("hydra", [], 4, False, None).srun == ()  # mpiexec, its daemons started by srun
    chosen = slurm.choose_launch("hydra", ["none", "pmi2", "pmix"], 4, False, "/usr/bin/srun", "srun")
    assert chosen.srun == ("/usr/bin/srun", "--mpi=pmi2", "-n", "4", "--kill-on-bad-exit=1")
    assert slurm.choose_launch("openmpi", ["pmix_v4", "pmix"], 2, False, "srun", "srun").srun[1] == "--mpi=pmix"
    assert slurm.choose_launch("hydra", ["pmi2"], 4, True, "srun", "srun").srun == ()  # ULFM needs Open MPI's runtime
    with pytest.raises(CLIError, match=r"needs srun --mpi=pmi2, this SLURM offers none, cray_shasta; leave out"):
        slurm.choose_launch("hydra", ["none", "cray_shasta"], 4, False, "srun", "srun")
    with pytest.raises(CLIError, match="this SLURM offers no srun on PATH"):
        slurm.choose_launch("hydra", [], 4, False, None, "srun")


def test_the_mpi_plugins_are_read_from_srun(tmp_path: Path) -> None:
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\necho 'MPI plugin types are...'\necho '\tnone'\necho '\tpmi2'\necho '\tpmix'\n"
                    "echo 'specific pmix plugin versions available: pmix_v4'\n")
    fake.chmod(0o755)
    assert slurm.mpi_plugins(str(fake)) == ["none", "pmi2", "pmix", "pmix_v4"]
    assert slurm.mpi_plugins(str(tmp_path / "missing")) == []


def test_the_hostfile_holds_each_node_and_its_tasks_in_the_mpis_form(tmp_path: Path) -> None:
    found = allocation({**SBATCH_ENV, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2,1"})
    assert slurm.write_hostfile(found, "hydra", tmp_path).read_text() == "n1:2\nn2:1\n"
    assert slurm.write_hostfile(found, "openmpi", tmp_path).read_text() == "n1 slots=2\nn2 slots=1\n"


def test_under_srun_each_rank_still_runs_below_the_guard_and_torch_meets_on_the_first_node(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(launch, "find_mpiexec", lambda explicit=None: "/usr/bin/mpiexec")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    (tmp_path / "hosts").write_text("fast-h0:1\nfast-h1:1\n")
    srun = ("srun", "--mpi=pmi2", "-n", "2", "--kill-on-bad-exit=1")
    job = Job(["python", "-m", "mpi4py", "t.py"], 2, hostfile=str(tmp_path / "hosts"), exits=tmp_path / "exits",
              rank_prefix=True, launcher=srun)
    command, env = job.command()
    assert command == [*srun, sys.executable, "-I", str(GUARD), "--lines=prefixed", "--redraws=all",
                       str(tmp_path / "exits"), "--", "python", "-m", "mpi4py", "t.py"]
    assert job.kind == "srun" and env["MASTER_ADDR"] == "fast-h0"


def test_a_node_slurm_took_from_the_job_is_named_and_a_status_0_without_a_finished_rank_is_no_success(
    tmp_path: Path, monkeypatch
) -> None:
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'JobId=42 JobName=t JobState=RUNNING NodeList=fast-h[0-2] BatchHost=fast-h0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    for name, value in SBATCH_ENV.items():
        monkeypatch.setenv(name, value)
    ending: dict = {}
    lines: list[str] = []
    assert slurm.slurm_ending(0, tmp_path, {}, ending, lines) == 1
    assert ending == {"slurm_lost_nodes": ["fast-h3"], "survived": False}
    assert lines == ["SLURM removed node(s) fast-h3 from job 42 (a node failure); the job did not finish (no rank "
                     "closed its worker)"]
    monkeypatch.setenv("SLURM_JOB_NODELIST", "fast-h[0-2]")  # nothing lost: nothing said
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "1(x3)")
    assert slurm.slurm_ending(0, tmp_path, {}, {}, lines) == 0 and len(lines) == 1
