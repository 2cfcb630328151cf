"""Clear endings where survival is impossible (issue 13, point 5): a lost rank is named, a dead-peer diagnosis never
crashes, one in-process worker's exception stops the others at once, a stopped launch leaves no process behind.

Every fault here is real (an exception raised on one worker, a rank killed with SIGKILL). Time bounds are generous
(a loaded 2-core machine): they tell an ending at once from one after a timeout, never a speed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fast_cli import FAST
from mpirun import TESTS, run_mpi
from training import CLASSES, FEATURES, batch, task

from fast_core import LocalCluster, Worker
from fast_core.cli.endings import lost_rank, lost_text
from fast_core.cli.launch import GUARD, descendants, first_exit
from fast_core.errors import PeerTimeout
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.observers.runlog import read_run


@pytest.mark.mpi
def test_the_mpi_diagnosis_of_a_timed_out_collective_names_ranks_and_never_crashes() -> None:
    out = run_mpi(3, TESTS / "endings_mpi.py", timeout=120)
    for check in ("ranks_in_other_collectives", "an_absent_rank", "a_timed_out_allreduce_names_the_rank"):
        assert f"{check} ok" in out, out


# the in-process engine: one worker's exception stops the others at once ------------------------------------------


class Broken(RuntimeError):
    """What the failing worker raises (a user's own error: it names no rank)."""


def _train_until_stopped(engine, strategy: str, failing: int, at_step: int) -> None:
    """Train with no end (60 s at most) until rank ``failing`` raises Broken at step ``at_step``."""
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(0.1), seed=engine.rank)
    worker = Worker(model, strategy, engine, observers=[]).start()
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        if engine.rank == failing and worker.step == at_step:
            raise Broken("the data loader broke")
        model.compute_gradients(*batch(x, y, shards[engine.rank], worker.step))
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()


def _communication_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fast-") and t.is_alive()]


@pytest.mark.parametrize(
    "strategy",
    ["allreduce", "dpsgd:ring", "async:ring", "adpsgd:ring", "gossip:synchronous=false", "easgd:synchronous=false"],
)
def test_one_workers_exception_stops_the_others_at_once_and_is_what_run_raises(strategy: str) -> None:
    began = time.monotonic()
    with pytest.raises(Broken, match="the data loader broke") as raised:
        LocalCluster(4, timeout=30).run(_train_until_stopped, strategy, 2, 20)
    assert time.monotonic() - began < 10, "the other workers waited (a timeout is 30 s) instead of stopping"
    assert any("raised on rank 2 of a LocalCluster of 4" in note for note in getattr(raised.value, "__notes__", []))
    deadline = time.monotonic() + 5
    while _communication_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _communication_threads(), "communication threads outlived the failed run"


def _dawdle_in_own_computation(seconds: float) -> None:
    time.sleep(seconds)


def _wait_for_a_dawdler(engine) -> None:
    if engine.rank == 1:
        _dawdle_in_own_computation(3.0)
        return
    engine.wait(engine.irecv(np.zeros(1), source=1, tag=5), timeout=0.5)


def test_an_in_process_timeout_says_where_the_awaited_rank_was() -> None:
    with pytest.raises(PeerTimeout, match=r"rank 0 waited 0.5 s for rank\(s\) \[1\]") as raised:
        LocalCluster(2, timeout=30).run(_wait_for_a_dawdler)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "rank 1 was at (innermost last)" in notes and "_dawdle_in_own_computation" in notes, notes


# fast run under MPICH: a rank killed with SIGKILL is named; SIGTERM ends the job as 143 ------------------------------


def _start_records(run_dir: Path, ranks: int, timeout: float = 60) -> dict[int, dict]:
    """Every rank's "start" record, once all have written one and a step record after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_run(run_dir)
        starts = {r: next((x for x in rs if x["kind"] == "start"), None) for r, rs in records.items()}
        stepped = [r for r, rs in records.items() if any(x["kind"] == "step" for x in rs)]
        if len(stepped) == ranks and all(starts.values()):
            return starts
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not all start training within {timeout} s: {read_run(run_dir)}")


def _gone(processes: set[tuple[int, int]], timeout: float = 5) -> list[int]:
    """The processes of ``processes`` still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid, _ in processes if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.mpi
@pytest.mark.parametrize("strategy, victim", [("allreduce", 2), ("async:ring", 0)])
def test_a_rank_killed_under_fast_run_is_named_with_its_step(tmp_path: Path, strategy: str, victim: int) -> None:
    run_dir = tmp_path / "r"
    command = [*FAST, "run", "-n", "4", "--no-progress", "--strategy", strategy, "--run-dir", str(run_dir)]
    example = ["-m", "fast_examples.numpy_digits", "--epochs", "1000000", "--snapshot-every", "1000"]
    proc = subprocess.Popen([*command, *example], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        starts = _start_records(run_dir, 4)
        job = descendants(proc.pid)
        pid = starts[victim]["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        status = proc.wait(timeout=60)
        ended = time.monotonic() - killed
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == 9, stderr
    assert ended < 10, f"the job took {ended:.1f} s to end after the kill"  # MPICH's teardown: well under 2 s idle
    assert re.search(rf"rank {victim} \(pid {pid}, host \S+\) was killed by SIGKILL at step \d+", stderr), stderr
    lost = json.loads((run_dir / "run.json").read_text())["lost"]
    assert (lost["rank"], lost["pid"], lost["signal"]) == (victim, pid, "SIGKILL")
    last_step = max(r["step"] for r in read_run(run_dir)[victim])
    assert lost["step"] == last_step
    assert not _gone(job), "processes of the job outlived it"


SLEEPER = """
import os, time
import fast_core
engine = fast_core.init()
with open(os.path.join(os.environ["FAST_RUN_DIR"], f"pid{engine.rank}"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.mpi
def test_sigterm_stops_fast_run_with_status_143_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "sleeper_for_sigterm.py"
    script.write_text(SLEEPER)
    run_dir = tmp_path / "r"
    proc = subprocess.Popen(
        [*FAST, "run", "-n", "2", "--run-dir", str(run_dir), str(script)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not all((run_dir / f"pid{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        assert subprocess.run(["pgrep", "-f", str(script)], capture_output=True).returncode == 0  # pgrep finds them
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == 128 + signal.SIGTERM, stderr
    assert "stopping the 2 workers (SIGTERM" in stderr
    assert "was killed by" not in stderr  # a stop asked for is no lost rank
    deadline = time.monotonic() + 5
    while left := subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split():
        assert time.monotonic() < deadline, f"processes of the job outlived fast run: {left}"
        time.sleep(0.1)


@pytest.mark.parametrize(
    "code, returncode, ended",
    [
        ("import os; os.kill(os.getpid(), 9)", -9, {"signal": "SIGKILL", "status": -9}),
        ("raise SystemExit(3)", 3, {"signal": None, "status": 3}),
        ("pass", 0, None),
    ],
    ids=["killed", "exit-status", "clean"],
)
def test_the_guard_records_a_bad_ending_and_ends_the_same_way(
    tmp_path: Path, code: str, returncode: int, ended
) -> None:
    exits = tmp_path / "exits"
    env = dict(os.environ, PMI_RANK="3")
    command = [sys.executable, "-I", str(GUARD), str(exits), "--", sys.executable, "-c", code]
    assert subprocess.run(command, env=env, timeout=60).returncode == returncode
    if ended is None:
        assert not exits.exists()
        return
    written = json.loads((exits / "rank3.json").read_text())
    assert {k: written[k] for k in ("rank", "signal", "status")} == {"rank": 3, **ended}
    assert first_exit(exits) == written


def test_the_lost_rank_is_the_earliest_ending_and_its_line_names_rank_pid_and_step(tmp_path: Path) -> None:
    exits = tmp_path / "exits"
    exits.mkdir()
    for rank, wall in ((1, 105.0), (2, 100.0)):
        ended = {"rank": rank, "pid": 40 + rank, "host": "h", "signal": "SIGKILL", "status": -9, "wall": wall}
        (exits / f"rank{rank}.json").write_text(json.dumps(ended))
    (tmp_path / "rank2.jsonl").write_text(
        json.dumps({"kind": "start", "rank": 2, "step": 0, "time": 0.0, "wall_start": 90.0})
        + "\n"
        + json.dumps({"kind": "step", "rank": 2, "step": 70, "time": 9.5})
        + "\n"
    )
    lost = lost_rank(exits, tmp_path)
    assert (lost["rank"], lost["step"], lost["record_age"]) == (2, 70, 0.5)
    assert lost_text(lost).startswith(
        "rank 2 (pid 42, host h) was killed by SIGKILL at step 70 or a little after (its last record, written 0.50 s"
    )


ONE_RANK_RAISES = """
import time
import numpy as np
import fast_core
from fast_core.model.numpy_model import SoftmaxRegression
engine = fast_core.init()
model = SoftmaxRegression(4, 2, seed=engine.rank)
worker = fast_core.Worker(model, "allreduce", engine).start()
for step in range(5):
    model.compute_gradients(np.ones((2, 4)), np.array([0, 1]))
    if step == 2 and engine.rank == {culprit}:
        {fault}
    worker.run_step(model.optimizer_step)
worker.close()
"""


@pytest.mark.mpi
@pytest.mark.parametrize(
    "fault, closing",
    [
        ('raise ValueError("the data loader broke")', r"rank 1 raised ValueError: the data loader broke"),
        ("time.sleep(60)", r"rank\(s\) \[0, 2\] stopped waiting for or losing rank\(s\) \[1\], which raised no error"),
    ],
)
def test_the_error_that_ended_a_job_is_named_once(tmp_path: Path, fault: str, closing: str) -> None:
    """A rank's own error: its traceback once, and the closing line and run.json name it. A rank that hangs: the
    others' PeerTimeouts are one line each (no traceback), and the closing line names the rank they waited for."""
    script = tmp_path / "job.py"
    script.write_text(ONE_RANK_RAISES.format(culprit=1, fault=fault))
    run_dir = tmp_path / "r"
    env = dict(os.environ, OMP_NUM_THREADS="1", FAST_TIMEOUT="4")
    command = [*FAST, "run", "-n", "3", "--no-progress", "--run-dir", str(run_dir), str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("fast: rank")]
    assert len(said) == 1 and re.search(closing, said[0]), done.stderr
    ended = json.loads((run_dir / "run.json").read_text())["error"]
    if fault.startswith("raise"):
        assert (ended["rank"], ended["consequence"]) == (1, False), ended
        assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    else:
        assert ended["consequence"] and ended["peers"] == [1], ended
        assert "Traceback" not in done.stderr, done.stderr
        assert len(re.findall(r"^\[[02]\] rank [02] stopped: PeerTimeout: ", done.stderr, re.MULTILINE)) == 2


@pytest.mark.mpi
def test_an_error_every_rank_raises_is_shown_once(tmp_path: Path) -> None:
    """A bad option is refused on every rank with the same error: one traceback, the other ranks one line each that
    names the rank showing it (their tracebacks in the run folder); a reused run folder starts afresh."""
    script = tmp_path / "job.py"
    script.write_text(ONE_RANK_RAISES.format(culprit="engine.rank", fault='raise ValueError("lr must be > 0")'))
    run_dir = tmp_path / "r"
    env = dict(os.environ, OMP_NUM_THREADS="1", FAST_TIMEOUT="20")
    command = [*FAST, "run", "-n", "3", "--no-progress", "--run-dir", str(run_dir), str(script)]
    for _ in range(2):  # the second launch reuses the folder: the first one's claims must not silence it
        done = subprocess.run(command, capture_output=True, text=True, timeout=100, env=env)
        assert done.returncode != 0
        assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
        teller = re.findall(r"^\[(\d)\] ValueError: lr must be > 0$", done.stderr, re.MULTILINE)
        others = re.findall(r"^\[(\d)\] rank \1 stopped with the error rank (\d) shows: ValueError", done.stderr, re.M)
        assert len(teller) == 1 and len(others) == 2, done.stderr
        assert {rank for rank, _ in others} | set(teller) == {"0", "1", "2"}
        assert {shown for _, shown in others} == set(teller), done.stderr
        assert sorted(p.name for p in (run_dir / "errors").glob("rank*.json")) == [f"rank{r}.json" for r in range(3)]
