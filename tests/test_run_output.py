"""What `fast run` shows: each rank's lines whole with ``[r] `` in front (stdout and stderr kept apart), the job's
bar (all ranks' samples over the budget, rate, ETA), the run folder at start and end, the job's rate and curves.png.
Real launches under mpiexec."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from fast_cli import FAST, fast

from fast_core.cli.guard import prefixed, without_redraws
from fast_core.cli.launch import GUARD
from fast_core.cli.summary import job_wall_clock, last
from fast_core.config.run import rank_prefix
from fast_core.engine.mpi_ft import replacement_commands
from fast_core.errors import ConfigError
from fast_core.observers.runlog import read_run

LINES = 30
"""Lines each rank of the chatty script prints; each is written in two pieces with a pause between."""

CHATTY = f"""
import sys, time
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
for epoch in range({LINES}):
    sys.stdout.write(f"Loss: {{rank}}.{{epoch}}")  # half a line, as print(..., end="") writes it
    sys.stdout.flush()
    time.sleep(0.002)
    sys.stdout.write(f" Train Epoch: {{epoch}}\\n")
    sys.stdout.flush()
print(f"rank {{rank}} to stderr", file=sys.stderr)
"""


def chatty(tmp_path: Path) -> str:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    return str(script)


@pytest.mark.mpi
@pytest.mark.parametrize("workers", [1, 4])
def test_every_line_of_every_rank_comes_whole_with_its_rank_in_front(tmp_path: Path, workers: int) -> None:
    done = fast("run", "-n", str(workers), "--no-progress", "--run-dir", str(tmp_path / "run"), chatty(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    seen: dict[int, list[int]] = {rank: [] for rank in range(workers)}
    for line in done.stdout.splitlines():
        match = re.fullmatch(r"\[(\d+)\] Loss: (\d+)\.(\d+) Train Epoch: (\d+)", line)
        assert match, f"a line not whole or without its rank: {line!r}\n{done.stdout}"
        prefix, rank, epoch, again = map(int, match.groups())
        assert prefix == rank and epoch == again, line  # the rank in front is the one that printed it
        seen[rank].append(epoch)
    assert seen == {rank: list(range(LINES)) for rank in range(workers)}  # every line, in order, once
    errors = [line for line in done.stderr.splitlines() if "to stderr" in line]
    assert sorted(errors) == [f"[{rank}] rank {rank} to stderr" for rank in range(workers)]  # stderr kept apart


@pytest.mark.mpi
def test_no_rank_prefix_shows_the_lines_as_printed_and_whole(tmp_path: Path) -> None:
    command = ["run", "-n", "2", "--no-progress", "--no-rank-prefix", "--run-dir", str(tmp_path / "run")]
    done = fast(*command, chatty(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert all(re.fullmatch(r"Loss: (\d)\.(\d+) Train Epoch: \2", line) for line in lines), done.stdout
    assert sorted(lines) == sorted(f"Loss: {r}.{e} Train Epoch: {e}" for r in range(2) for e in range(LINES))


def test_rank_prefix_variable() -> None:
    assert rank_prefix({}) and rank_prefix({"FAST_RANK_PREFIX": "1"})
    assert not rank_prefix({"FAST_RANK_PREFIX": "0"}) and not rank_prefix({"FAST_RANK_PREFIX": "no"})
    with pytest.raises(ConfigError, match="FAST_RANK_PREFIX='maybe'"):
        rank_prefix({"FAST_RANK_PREFIX": "maybe"})


def test_prefix_goes_before_every_line_and_a_bars_redraws() -> None:
    assert prefixed(b"[3] ", b"a\nb\r\nbar 1\rbar 2\rtail") == b"[3] a\n[3] b\r\n[3] bar 1\r[3] bar 2\r[3] tail"


@pytest.mark.mpi
def test_run_shows_the_folder_the_bar_the_rate_and_writes_curves(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = ["run", "-n", "2", "--progress", "--strategy", "dpsgd:ring", "--run-dir", str(run_dir)]
    done = fast(*command, "-m", "fast_examples.numpy_digits", "--epochs", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count(f"fast: run folder: {run_dir}\n") == 2  # at the start and at the end
    assert all(line.startswith("[0] ") for line in done.stdout.splitlines()), done.stdout  # rank 0 prints

    ranks = read_run(run_dir)
    total = ranks[0][0]["budget_samples"]  # the script's --epochs, as its Budget: 4 global epochs
    samples = sum(last(records, "close")["samples"] for records in ranks.values())
    assert samples == total
    drawn = re.findall(rf"dpsgd:ring: +\d+%\|[^|]*\| (\d+)/{total} \[(\d\d:\d\d)<(\d\d:\d\d), ", done.stderr)
    assert drawn and int(drawn[-1][0]) == total, done.stderr  # samples of all ranks over the total, elapsed<ETA

    rate = re.search(r"fast: job: (\d+) samples in ([\d.]+) s wall-clock, ([\d.]+) samples/s", done.stderr)
    assert rate, done.stderr
    seconds = job_wall_clock(ranks)
    assert int(rate[1]) == samples and float(rate[2]) == pytest.approx(seconds, abs=0.006)
    assert float(rate[3]) == pytest.approx(samples / seconds, rel=0.01)

    curves = run_dir / "curves.png"
    assert f"fast: loss and accuracy against time: {curves}" in done.stderr
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bars_redraws_are_the_lines_a_lone_carriage_return_ends() -> None:
    keras = "\b\b\r 1/9 ━\b\b\r 2/9 ━━\b\b\r 9/9 ━━━ loss 0.5\n".encode()  # Keras: backspaces, \r, then the draw
    assert without_redraws(b"epoch 1\n" + keras + b"tail") == "epoch 1\n 9/9 ━━━ loss 0.5\ntail".encode()
    assert without_redraws(b"\r 10%|#\r 100%|##\n\r\n") == b" 100%|##\n\r\n"  # tqdm's; \r\n ends a whole line


BARS = """
import sys, time
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
for step in range(5):
    sys.stderr.write(f"\\rrank {rank} step {step}/5")
    sys.stderr.flush()
    time.sleep(0.01)
sys.stderr.write(f"\\rrank {rank} step 5/5 done\\n")
"""


@pytest.mark.mpi
@pytest.mark.parametrize("choice, drawn", [(None, []), ("rank0", [0]), ("all", [0, 1])])
def test_only_the_chosen_ranks_bars_are_redrawn_and_every_last_draw_shows(
    tmp_path: Path, choice: str | None, drawn: list[int]
) -> None:
    """Not a terminal (as in a log): nobody's redraws by default; ``--rank-bars`` picks rank 0's or every rank's."""
    script = tmp_path / "bars.py"
    script.write_text(BARS)
    chosen = [] if choice is None else ["--rank-bars", choice]
    command = [*FAST, "run", "-n", "2", "--no-progress", *chosen, "--run-dir", str(tmp_path / "run"), str(script)]
    done = subprocess.run(command, capture_output=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    said = done.stderr.decode()  # as bytes: text mode would turn each \r into a newline
    assert done.returncode == 0, said
    redrawn = sorted({int(r) for r in re.findall(r"\[(\d)\] rank \1 step \d/5\r", said)})
    assert redrawn == drawn, repr(said)
    for rank in range(2):
        assert f"[{rank}] rank {rank} step 5/5 done\n" in said, repr(said)


def test_a_replacements_guard_prefixes_the_rank_it_took_over_and_records_its_own_ending(tmp_path: Path) -> None:
    """--max-restarts: the survivors start a replacement below ``FAST_GUARD`` with ``--rank=R`` (mpi_ft.grow)."""
    exits = tmp_path / "exits"
    child = "import os, sys; print(os.environ['FAST_GUARD']); sys.stderr.write('half'); sys.exit(3)"
    guard = [sys.executable, "-I", str(GUARD), "--lines=prefixed", "--rank=5", str(exits), "--"]
    done = subprocess.run([*guard, sys.executable, "-c", child], capture_output=True, text=True, timeout=30)
    assert done.returncode == 3 and done.stderr == "[5] half", done.stderr
    told = json.loads(done.stdout.removeprefix("[5] "))
    assert told == [a for a in guard if a != "--rank=5"]  # how the rank's own replacements are started
    command = ["python", "-m", "mpi4py", "train.py"]
    with mock.patch.dict(os.environ, {"FAST_GUARD": json.dumps(told)}), mock.patch.object(sys, "orig_argv", command):
        assert replacement_commands((2,)) == [[*told[:3], "--rank=2", *told[3:], *command]]
    (ended,) = exits.glob("rank5.*.json")  # beside the lost process's rank5.json, which it does not replace
    record = json.loads(ended.read_text())
    assert (record["rank"], record["status"], ended.name) == (5, 3, f"rank5.{record['pid']}.json")


def test_a_rank_dies_with_its_guard(tmp_path: Path) -> None:
    """A guard killed on its own (kill -9 of the wrong pid) takes its rank with it: mpiexec, whose child the guard
    is, sees the loss, and no rank trains on unseen (issue 31: the job recovered, yet fast run said it failed)."""
    child = tmp_path / "child.pid"
    rank = f"import os, time; open({str(child)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    guard = [sys.executable, "-I", str(GUARD), "--lines=prefixed", "--rank=1", str(tmp_path / "exits"), "--"]
    started = subprocess.Popen([*guard, sys.executable, "-c", rank])
    deadline = time.monotonic() + 30
    while not (child.is_file() and child.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(child.read_text())
    started.kill()  # the guard, not the rank
    started.wait(timeout=10)
    while Path(f"/proc/{pid}").exists() and _state(pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists() or _state(pid) == "Z", "the rank outlived its killed guard"


def _state(pid: int) -> str:
    """A process's state letter from /proc (Z: a zombie, dead and waiting for its parent to read its status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


BEATS_THEN_FREEZES = """
import os, signal, time
from fast_core.runtime.heartbeat import start_heartbeat

start_heartbeat(int(os.environ["FAST_HEARTBEAT_FD"]))
time.sleep(1.5)
os.kill(os.getpid(), {signal})
"""


@pytest.mark.parametrize("frozen", [True, False])
def test_the_guard_kills_a_rank_whose_heartbeat_stops_and_records_it_frozen(tmp_path: Path, frozen: bool) -> None:
    """A rank stopped with SIGSTOP beats no more: after --freeze seconds its guard kills it and records it frozen. A
    rank that has not beaten yet (still importing) is never taken for frozen: it exits as it likes."""
    exits = tmp_path / "exits"
    guard = [sys.executable, "-I", str(GUARD), "--lines=prefixed", "--freeze=1", "--rank=3", str(exits), "--"]
    child = BEATS_THEN_FREEZES.format(signal="signal.SIGSTOP") if frozen else "import time; time.sleep(2.5)"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run([*guard, sys.executable, "-c", child], capture_output=True, timeout=60, env=env)
    if not frozen:
        assert done.returncode == 0 and not exits.exists(), done.stderr
        return
    assert done.returncode == -9, done.stderr  # the guard ends as its rank did
    (ended,) = exits.glob("rank3.*.json")
    record = json.loads(ended.read_text())
    assert (record["signal"], record["frozen"]) == ("SIGKILL", 1.0)


def test_a_freeze_bound_the_peers_would_not_outlast_is_refused(tmp_path: Path) -> None:
    done = fast("run", "-n", "2", "--freeze-timeout", "200", "--run-dir", str(tmp_path / "r"), chatty(tmp_path))
    assert done.returncode == 2 and "--freeze-timeout 200 is not below FAST_TIMEOUT (120 s)" in done.stderr
