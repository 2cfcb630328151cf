"""The `fast` command end to end (subprocesses, real mpiexec launches of 2-3 ranks) and the reporting it relies on.

Core env: no deep-learning framework; the NumPy example is the training script. Launches are few and short (each
pays NumPy, scikit-learn and mpi4py imports on every rank).
"""

from __future__ import annotations

import io
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
from fast_cli import FAST, bench, check_fixed_straggler, check_job_figures, fast

import fast_core
from fast_core.cli import main as fast_main
from fast_core.cli.launch import descendants, find_mpiexec
from fast_core.cli.summary import markdown, median, summarize
from fast_core.config.run import RunConfig
from fast_core.errors import ConfigError
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.observers import straggler as straggler_module
from fast_core.observers.progress import ProgressBar
from fast_core.observers.runlog import read_run
from fast_core.observers.straggler import Straggler, calibrated_seconds, compute_per_step
from fast_core.topology import ring

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def wait_for_files(paths: list[Path], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text().strip() for p in paths):
        assert time.monotonic() < deadline, f"the ranks never wrote {paths}"
        time.sleep(0.1)


# fast run ----------------------------------------------------------------------------------------------------------


@pytest.mark.mpi
def test_run_passes_the_strategy_and_writes_records_that_match_the_scripts_output(tmp_path: Path) -> None:
    run = "run -n 2 --strategy allreduce --log-every 7"
    example = ["-m", "fast_examples.numpy_digits", "--epochs", "2"]
    done = fast(*run.split(), "--run-dir", str(tmp_path / "r"), *example)
    assert done.returncode == 0, done.stderr
    assert "2 workers, strategy AllReduce()" in done.stdout  # FAST_STRATEGY reached the script
    ranks = read_run(tmp_path / "r")
    assert sorted(ranks) == [0, 1]
    printed = re.search(r"test accuracy of the averaged model: ([0-9.]+)  \((\d+) steps, ([0-9.]+) MB", done.stdout)
    steps = int(printed.group(2))
    for records in ranks.values():
        kinds = [r["kind"] for r in records if r["kind"] != "consensus"]  # rank 0's consensus curve follows
        assert kinds[0] == "start" and kinds[-2:] == ["close", "result"], kinds
        step_records = [r for r in records if r["kind"] == "step"]
        assert [r["step"] for r in step_records] == [*range(7, steps + 1, 7), steps]  # every 7 steps, and the last
        epochs = [r for r in records if r["kind"] == "epoch"]
        assert [e["epoch"] for e in epochs] == [1, 2]
        assert all(0.5 < e["val_accuracy"] <= 1 and e["consensus_distance"] == 0.0 for e in epochs)  # all-reduce
        close = next(r for r in records if r["kind"] == "close")
        assert close["step"] == steps and close["samples"] == steps * 16  # batch 16, drop_last
        result = next(r for r in records if r["kind"] == "result")
        assert result["test_accuracy"] == pytest.approx(float(printed.group(1)), abs=5e-5)
    close = next(r for r in ranks[0] if r["kind"] == "close")
    assert close["bytes_sent"] / 1e6 == pytest.approx(float(printed.group(3)), abs=5e-3)
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["exit_status"] == 0 and run["workers"] == 2 and run["strategy"] == "allreduce"


STRAGGLING = """
import os, time
import numpy as np
import fast_core
from fast_core.observers.straggler import Straggler
from fast_core.model.numpy_model import SGD, SoftmaxRegression

engine = fast_core.init()
model = SoftmaxRegression(4, 2, optimizer=SGD(0.1))
worker = fast_core.Worker(model, None, engine).start()  # None: FAST_STRATEGY / FAST_TOPOLOGY from fast run
print(f"rank {engine.rank}: {worker.strategy}", flush=True)
x, y = np.ones((8, 4)), np.zeros(8, dtype=np.int64)
computing = 0.0
for _ in range(20):
    begin, wall = time.process_time(), time.perf_counter()
    while time.process_time() - begin < 0.01:  # 10 ms of CPU time: compute, not a sleep
        pass
    worker.records.step(loss=model.compute_gradients(x, y), samples=8)
    computing += time.perf_counter() - wall
    worker.before_step()
    model.optimizer_step()
    worker.after_step()
worker.close()
slept = sum(o.slept for o in worker.observers if isinstance(o, Straggler))
os.write(1, f"rank {engine.rank} slept {slept:.4f} computed {computing:.4f}\\n".encode())
"""


@pytest.mark.mpi
def test_run_a_script_with_topology_and_a_straggler_that_is_slower_by_its_factor(tmp_path: Path) -> None:
    script = tmp_path / "straggling.py"
    script.write_text(STRAGGLING)
    run = "run -n 2 --strategy async --topology ring --straggler 4 --verbose"
    done = fast(*run.split(), "--run-dir", str(tmp_path / "r"), str(script))
    assert done.returncode == 0, done.stderr
    assert "rank 0: AsyncAveraging(topology='ring'" in done.stdout  # the topology reached the strategy
    assert "rank 1 4x slower" in done.stderr
    for rank in (0, 1):  # --verbose: every rank prints its records (on stderr, with its rank in front)
        assert re.search(
            rf"^\[{rank}\] rank {rank} step 20 at [0-9.]+ s, close record: .*samples 160", done.stderr, re.M
        )
    # both ranks compute >= 10 ms per step; rank 1 (the last) also sleeps 3 x the wall time of its compute
    sleeps = {
        int(r): (float(s), float(c)) for r, s, c in re.findall(r"rank (\d) slept (\S+) computed (\S+)", done.stdout)
    }
    assert sleeps[0] == (0.0, pytest.approx(sleeps[0][1])), sleeps
    slept, computed = sleeps[1]
    assert slept == pytest.approx(3 * computed, rel=0.1) and slept >= 20 * 3 * 0.010, sleeps
    seconds = {rank: records[-1]["step_time"] for rank, records in read_run(tmp_path / "r").items()}
    assert seconds[1] >= seconds[0] + 0.4, seconds  # asynchronous rank 0 did not wait for the straggler


def _straggler_of_environment(rank: int, size: int) -> Straggler | None:
    """The Straggler that ``fast run --straggler``'s variables make of this rank (the builder is given the config)."""
    return Straggler.for_rank(RunConfig.from_environment(), rank, size)


def test_straggler_sleeps_factor_minus_one_times_the_compute_and_only_on_its_rank(monkeypatch) -> None:
    straggler = Straggler(3.0)
    begin = time.perf_counter()
    straggler.slow_down(0.02)  # after 20 ms of compute
    assert straggler.slept == pytest.approx(0.04) and time.perf_counter() - begin >= 0.04
    monkeypatch.setenv("FAST_STRAGGLER", "3")
    assert [_straggler_of_environment(r, 4) is not None for r in range(4)] == [False, False, False, True]
    monkeypatch.setenv("FAST_STRAGGLER_RANK", "1")
    assert [_straggler_of_environment(r, 4) is not None for r in range(4)] == [False, True, False, False]
    monkeypatch.setenv("FAST_STRAGGLER_RANK", "4")
    with pytest.raises(fast_core.ConfigError, match="not a rank of this job"):
        _straggler_of_environment(0, 4)


def test_the_fixed_straggler_sleeps_its_seconds_every_step_on_its_rank_only(monkeypatch) -> None:
    pauses: dict[int, list[float]] = {}  # by thread: LocalCluster runs each rank in a thread of its own

    class Clock:  # the straggler module's clock: real time, but its sleeps are written down, not slept
        perf_counter = staticmethod(time.perf_counter)

        @staticmethod
        def sleep(seconds: float) -> None:
            pauses.setdefault(threading.get_ident(), []).append(seconds)

    monkeypatch.setattr(straggler_module, "time", Clock)
    config = RunConfig(straggler_seconds=0.25, straggler_rank=1)

    def train(engine) -> tuple[int, float, list[float]]:
        model = SoftmaxRegression(3, 2, optimizer=SGD(0.1))
        worker = fast_core.Worker(model, "async:ring", engine, config=config).start()
        for step in range(6):
            if engine.rank == 1 and step % 2:  # some steps compute longer: a fixed sleep does not care
                begin = time.perf_counter()
                while time.perf_counter() - begin < 0.005:
                    pass
            model.compute_gradients(np.ones((2, 3)), np.zeros(2, dtype=np.int64))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
        worker.close()
        slept = sum(o.slept for o in worker.observers if isinstance(o, Straggler))
        return worker.step, slept, pauses.get(threading.get_ident(), [])

    # exactly S per step, on rank 1 only
    assert fast_core.LocalCluster(3).run(train) == [(6, 0.0, []), (6, 1.5, [0.25] * 6), (6, 0.0, [])]
    monkeypatch.setenv("FAST_STRAGGLER_SECONDS", "0.01")
    assert [_straggler_of_environment(r, 3) is not None for r in range(3)] == [False, False, True]
    assert _straggler_of_environment(2, 3).seconds == 0.01
    monkeypatch.setenv("FAST_STRAGGLER_SECONDS", "0")  # no sleep: nothing to pay
    assert _straggler_of_environment(2, 3) is None
    monkeypatch.setenv("FAST_STRAGGLER", "3")
    with pytest.raises(ConfigError, match="FAST_STRAGGLER and FAST_STRAGGLER_SECONDS are both set: give one"):
        _straggler_of_environment(2, 3)
    with pytest.raises(ConfigError, match="^FAST_STRAGGLER_SECONDS='-1': give the seconds"):
        RunConfig.from_environment({"FAST_STRAGGLER_SECONDS": "-1"})
    fixed = RunConfig(straggler_seconds=0.02, straggler_rank=0)
    assert RunConfig.from_environment(fixed.to_environment()) == fixed


def test_calibration_arithmetic_compute_per_step_from_records_and_the_fixed_sleep() -> None:
    def step(n: int, compute: float) -> dict:
        return {"kind": "step", "step": n, "compute_seconds": compute}

    # step records: the steps between the first record and the last (the first steps pay one-time costs)
    records = [{"kind": "start", "step": 0}, step(5, 0.9), step(10, 1.4), step(15, 1.9), {"kind": "epoch"}]
    assert compute_per_step(records) == pytest.approx((1.9 - 0.9) / 10)
    # one step record only: the close record's totals
    close = {"kind": "close", "step": 8, "compute_seconds": 0.4}
    assert compute_per_step([step(8, 0.4), close]) == pytest.approx(0.05)
    assert compute_per_step([{"kind": "start", "step": 0}]) is None  # nothing measured
    assert calibrated_seconds(3.0, 0.05) == pytest.approx(0.1)  # (F - 1) x compute
    assert calibrated_seconds(1.0, 0.05) == 0.0
    with pytest.raises(ConfigError, match="factor must be >= 1"):
        calibrated_seconds(0.5, 0.05)


FAILING = """
import sys, time
import fast_core
engine = fast_core.init()
if engine.rank == 1:
    sys.exit(3)
time.sleep(60)
"""


@pytest.mark.mpi
def test_run_returns_the_exit_status_of_a_failing_rank_at_once(tmp_path: Path) -> None:
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    began = time.monotonic()
    done = fast("run", "-n", "2", "--run-dir", str(tmp_path / "r"), str(script), timeout=60)
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - began < 40  # rank 0 sleeps 60 s: the job was aborted, not waited for
    assert "exit status 3" in done.stderr
    assert json.loads((tmp_path / "r" / "run.json").read_text())["exit_status"] == 3


SLEEPING = """
import os, signal, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
if "--stubborn" in sys.argv:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(os.environ["FAST_RUN_DIR"], f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("stubborn", [False, True], ids=["ranks-stop", "ranks-ignore-signals"])
def test_ctrl_c_stops_every_rank(tmp_path: Path, stubborn: bool) -> None:
    script = tmp_path / "sleeping.py"
    script.write_text(SLEEPING)
    run_dir = tmp_path / "r"
    args = ["run", "-n", "2", "--grace", "2", "--run-dir", str(run_dir), str(script)]
    proc = subprocess.Popen([*FAST, *args, *(["--stubborn"] if stubborn else [])], stderr=subprocess.PIPE, text=True)
    try:
        wait_for_files([run_dir / "pid0", run_dir / "pid1"])
        pids = [int((run_dir / f"pid{r}").read_text()) for r in (0, 1)]
        job = descendants(proc.pid)
        assert {pid for pid, _ in job} >= set(pids)  # the ranks run below the launcher
        proc.send_signal(signal.SIGINT)  # what Ctrl-C at the terminal sends to `fast run`
        status = proc.wait(timeout=30)
        assert status != 0
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid, _ in job) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid, _ in job if alive(pid)], "processes of the job outlived fast run"
        stderr = proc.stderr.read()
        assert "stopping the 2 workers" in stderr
        if stubborn:
            assert "did not stop within 2 s: killing them" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()


# mistakes get one clear line, no traceback --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "-n", "2", "--strategy", "dpsdg", "x.py"], "unknown strategy 'dpsdg' (did you mean 'dpsgd'?)"),
        (["run", "-n", "2", "--strategy", "dpsgd", "--topology", "rnig", "x.py"], "unknown topology 'rnig'"),
        (["run", "-n", "2", "no_such_script.py"], "script not found: no_such_script.py"),
        (["run", "-n", "2", "-m", "no_such.module"], "no module named 'no_such.module'"),
        (["run", "-n", "2", "--mpiexec", "no-such-mpiexec", "x.py"], "--mpiexec no-such-mpiexec: no such executable"),
        (["run", "-n", "2", "--straggler", "3", "--straggler-rank", "5", "x.py"], "is not a rank of 2 workers"),
        (["topology", "rnig", "-n", "4"], "unknown topology 'rnig' (did you mean 'ring'?)"),
        (["bench", "--framework", "numpy", "--strategies", "allreduce,asink"], "unknown strategy 'asink'"),
        (["bench", "--framework", "numpy", "--compare-ddp"], "--compare-ddp runs torch DistributedDataParallel"),
        (["bench", "--framework", "numpy", "--data", "mnist1d"], "the numpy example offers none"),
    ],
)
def test_user_mistakes_are_one_line_and_status_2(tmp_path: Path, monkeypatch, capsys, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print('never run')\n")
    with pytest.raises(SystemExit) as exit_:
        fast_main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("fast: error: ") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_a_mistake_in_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    done = fast("run", "-n", "2", "missing.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == "fast: error: script not found: missing.py"


def test_missing_mpiexec_names_the_install_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Exception, match=re.escape("pip install 'fast-training[mpi]'")):
        find_mpiexec()


@pytest.mark.mpi
def test_more_workers_than_cpus_is_a_warning_naming_cpu_count(tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import sys\nfrom mpi4py import MPI\nsys.stdout.write(f'rank {MPI.COMM_WORLD.Get_rank()}\\n')\n")
    workers = (os.cpu_count() or 1) + 1
    done = fast("run", "-n", str(workers), "--run-dir", str(tmp_path / "r"), str(script))
    assert done.returncode == 0, done.stderr
    assert "os.cpu_count()" in done.stderr and f"{workers} workers" in done.stderr
    assert sorted(re.findall(r"rank (\d+)", done.stdout)) == [str(r) for r in range(workers)]


# fast topology -------------------------------------------------------------------------------------------------------


def test_topology_prints_neighbours_degree_and_spectral_gap_and_draws_it(tmp_path: Path) -> None:
    out = tmp_path / "ring.png"
    done = fast("topology", "ring", "-n", "16", "--plot", str(out))
    assert done.returncode == 0, done.stderr
    expected = ring(16)
    gap = float(re.search(r"spectral gap 1 - \|lambda_2\(W\)\|: ([0-9.]+)", done.stdout).group(1))
    closed_form = 1 - (1 / 3 + 2 / 3 * np.cos(2 * np.pi / 16))  # W's eigenvalues: 1/3 + 2/3 cos(2 pi k / 16)
    assert gap == pytest.approx(expected.spectral_gap(), abs=1e-4) and gap == pytest.approx(closed_form, abs=1e-4)
    assert "degree (in-neighbours per rank): 2" in done.stdout
    assert re.search(r"^\s+0\s+0\.333\s+1 \(0\.333\), 15 \(0\.333\)\s+->\s+1, 15$", done.stdout, re.MULTILINE)
    assert len(re.findall(r"^\s+\d+\s+0\.333 ", done.stdout, re.MULTILINE)) == 16
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[2] in (3, 4)  # a real PNG


# fast bench ------------------------------------------------------------------------------------------------------


@pytest.mark.mpi
def test_bench_numpy_writes_table_csv_and_plots(tmp_path: Path) -> None:
    bench_dir = tmp_path / "b"
    options = "--framework numpy -n 2 --strategies allreduce,async:ring --epochs 3 --straggler 3"
    done, rows = bench(bench_dir, *options.split(), timeout=180)
    assert list(rows) == ["allreduce", "async:ring"]
    assert rows["allreduce"]["mode"] == "sync" and rows["async:ring"]["mode"] == "async"
    parameters = (64 * 10 + 10) * 8  # float64 softmax regression on 8x8 digits
    # all-reduce moves 2 (N-1)/N of the buffer per step, plus the budget's two 8-byte allreduces (--epochs is a budget
    # of global epochs: the batch sizes at the first claim, the job's samples at close); each async rank sends its
    # parameters (behind a 16-byte header) to each ring neighbour (one here) at most once a step, once at its start
    # and once at its close, and 16-byte budget requests or grants (at most one a claim of the asking rank)
    steps = int(rows["allreduce"]["steps"])
    assert float(rows["allreduce"]["bytes_sent_per_step"]) == pytest.approx(parameters + 2 * 8 / steps)
    assert float(rows["async:ring"]["bytes_sent_per_step"]) > 0
    async_run = read_run(bench_dir / "async-ring")
    closes = [next(r for r in records if r["kind"] == "close") for records in async_run.values()]
    most_steps = max(close["step"] for close in closes)
    for close in closes:
        assert 0 < close["bytes_sent"] <= (parameters + 16) * (close["step"] + 2) + 16 * most_steps, close
    for row in rows.values():
        assert float(row["final_accuracy"]) > 0.85
        assert float(row["job_samples_per_second"]) > 0
    assert float(rows["allreduce"]["vs_baseline"]) == 1.0
    for label in rows:  # every run's records and output are kept in its own folder
        run = read_run(bench_dir / label.replace(":", "-"))
        assert sorted(run) == [0, 1]
        result = next(r for r in run[0] if r["kind"] == "result")  # rank 0's consensus records may follow it
        assert result["test_accuracy"] == pytest.approx(float(rows[label]["final_accuracy"]))
        check_job_figures(rows[label], run)  # the job columns are what the records say
    versus = float(rows["async:ring"]["job_samples_per_second"]) / float(rows["allreduce"]["job_samples_per_second"])
    assert float(rows["async:ring"]["vs_baseline"]) == pytest.approx(versus)
    # --straggler 3: one calibration launch, then the same fixed sleep per step on rank 1 in both runs
    pause = check_fixed_straggler(bench_dir, list(rows), rank=1)
    table = (bench_dir / "results.md").read_text()
    assert "| `allreduce` | sync |" in table and "| `async:ring` | async |" in table and "rank 1 3x slower" in table
    assert f"= {pause * 1e3:.3f} ms before each optimizer step" in table  # what was calibrated, said
    assert "| job wall-clock s | job samples/s | vs allreduce | per-rank samples/s (mean) |" in table
    assert table.split("\n\n")[-1].strip() in done.stdout  # the table is also printed
    import matplotlib.image

    for name in ("loss.png", "accuracy.png"):
        height, width, _ = matplotlib.image.imread(bench_dir / name).shape
        assert width > 1000 and height > 400


def test_bench_rows_are_job_figures_and_time_to_target_is_the_consensus_models_when_recorded() -> None:
    def rank(r: int, start: float, stop: float, trained: float, samples: int, extra: list) -> list[dict]:
        return [
            {"kind": "start", "rank": r, "step": 0, "time": 0.0, "wall_start": start},
            *extra,
            {
                "kind": "close",
                "rank": r,
                "step": 10,
                "samples": samples,
                "step_time": trained,
                "wall_stop": stop,
                "bytes_sent": 100,
                "mean_staleness": 1.0,
            },
            {"kind": "result", "rank": r, "step": 10, "test_accuracy": 0.93},
        ]

    epochs = [{"kind": "epoch", "time": 1.0, "val_accuracy": 0.8}, {"kind": "epoch", "time": 2.0, "val_accuracy": 0.95}]
    consensus = [
        {"kind": "consensus", "time": 3.0, "val_accuracy": 0.85},
        {"kind": "consensus", "time": 4.0, "val_accuracy": 0.91},
    ]
    ranks = {0: rank(0, 100.0, 104.0, 4.0, 400, epochs + consensus), 1: rank(1, 100.5, 110.0, 9.5, 200, [])}
    row = summarize("async", "async", ranks, target=0.9)
    assert row.job_seconds == 10.0 and row.job_samples == 600  # earliest start to latest stop; all ranks' samples
    assert row.job_samples_per_second == 60.0 and row.per_rank_samples_per_second == pytest.approx(
        (100 + 200 / 9.5) / 2
    )
    assert (row.seconds_to_target, row.target_model, row.final_accuracy) == (4.0, "consensus", 0.93)
    without = summarize("allreduce", "sync", {0: rank(0, 0.0, 5.0, 5.0, 50, epochs)}, target=0.9)
    assert (without.seconds_to_target, without.target_model) == (2.0, "rank 0")  # rank 0's epochs, marked
    table = markdown([without, row], None, target=0.9)
    assert "| 2.00* |" in table and "| 4.00 |" in table and "(consensus model)" in table
    assert table.endswith(
        "in the run of `allreduce`, so the time to target shown is rank 0's own replica's, at its epoch ends."
    )
    assert median([row, row]).target_model == "consensus" and median([row, without]).target_model == "mixed"


# reporting inside the Worker (in-process, 2 ranks on a LocalCluster) ---------------------------------------------


def test_worker_records_average_between_records_and_count_samples(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAST_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FAST_LOG_EVERY", "4")
    losses = np.arange(10, dtype=float)

    def train(engine) -> None:
        model = SoftmaxRegression(3, 2, optimizer=SGD(0.1))
        worker = fast_core.Worker(model, "dpsgd:ring", engine).start()
        for step in range(10):
            model.compute_gradients(np.ones((2, 3)), np.zeros(2, dtype=np.int64))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            worker.records.step(loss=losses[step] + engine.rank, samples=2)
        worker.group.consensus_distance()
        worker.records.epoch(val_accuracy=0.5)
        worker.close()
        worker.records.result(test_accuracy=0.75)

    fast_core.LocalCluster(2).run(train)
    for rank, records in read_run(tmp_path).items():
        steps = [r for r in records if r["kind"] == "step"]
        # a record after steps 4 and 8, and one at close; record() follows after_step here, so they hold the losses
        # of steps 0-2, 3-6 and 7-9
        assert [r["step"] for r in steps] == [4, 8, 10]
        expected = [losses[0:3].mean(), losses[3:7].mean(), losses[7:].mean()]
        assert [r["loss"] for r in steps] == pytest.approx([value + rank for value in expected])
        assert [r["samples"] for r in steps] == [6, 14, 20]
        epoch = next(r for r in records if r["kind"] == "epoch")
        assert epoch["epoch"] == 1 and epoch["val_accuracy"] == 0.5 and epoch["consensus_distance"] is not None
        assert records[-2]["kind"] == "close" and records[-2]["samples"] == 20
        assert records[-1] == {**records[-1], "kind": "result", "test_accuracy": 0.75}
        assert records[0]["size"] == 2 and "DPSGD" in records[0]["strategy"]


def test_records_hold_the_common_start_each_ranks_stop_and_its_compute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FAST_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FAST_LOG_EVERY", "2")

    def train(engine) -> None:
        model = SoftmaxRegression(3, 2, optimizer=SGD(0.1))
        worker = fast_core.Worker(model, "async:ring", engine).start()
        for _ in range(4):
            model.compute_gradients(np.ones((2, 3)), np.zeros(2, dtype=np.int64))
            worker.before_step()
            model.optimizer_step()
            worker.after_step()
            worker.records.step(samples=2)
        worker.close()
        if engine.rank == 0:  # what an example writes for the consensus model: its own time, kept as given
            worker.records.consensus(time=0.5, val_accuracy=0.75)

    fast_core.LocalCluster(2).run(train)
    for rank, records in read_run(tmp_path).items():
        start, close = records[0], next(r for r in records if r["kind"] == "close")
        assert start["kind"] == "start" and start["wall_start"] <= close["wall_stop"]
        assert close["wall_stop"] - start["wall_start"] == pytest.approx(close["step_time"], abs=0.05)
        computed = [r["compute_seconds"] for r in records]
        assert computed == sorted(computed) and 0 < close["compute_seconds"] <= close["step_time"]
        assert "straggler_slept" not in close
        consensus = [r for r in records if r["kind"] == "consensus"]
        assert consensus == ([{**consensus[0], "time": 0.5, "val_accuracy": 0.75}] if rank == 0 else [])


def test_without_fast_run_the_worker_reports_nothing(tmp_path: Path, monkeypatch) -> None:
    for name in ("FAST_RUN_DIR", "FAST_PROGRESS", "FAST_VERBOSE", "FAST_STRAGGLER"):
        monkeypatch.delenv(name, raising=False)
    worker = fast_core.Worker(SoftmaxRegression(3, 2), "allreduce", fast_core.LocalCluster(1).engine(0))
    assert list(worker.observers) == []


def test_progress_bar_keeps_the_scripts_lines_whole(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    bar = ProgressBar("dpsgd:ring")
    print("epoch   1  loss 0.5000")
    for _ in range(5):
        bar.update()
    bar.show({"loss": 0.25, "consensus_distance": 1e-3, "epoch": 2})
    print("partial", end="")
    bar.close()
    assert sys.stdout is out  # restored
    text = out.getvalue()
    assert "\nepoch   1  loss 0.5000\n" in "\n" + text.replace("\r", "\n")
    assert re.search(r"dpsgd:ring: 5 steps .*loss=0\.25, consensus=0\.001, epoch=2", text), text
    assert "partial" in text


def test_bench_takes_whole_strategy_strings_with_their_options() -> None:
    from fast_core.cli import bench, parser
    from fast_core.cli.common import CLIError
    from fast_core.cli.frameworks import FRAMEWORKS

    def planned(*argv: str) -> list[tuple[str, str]]:
        runs = bench.plan(FRAMEWORKS["numpy"], parser().parse_args(["bench", "-n", "4", *argv]))
        return [(run.label, run.mode) for run in runs]

    assert [label for label, _ in planned()] == list(bench.DEFAULT_STRATEGIES)
    assert planned("--strategy", "async:torus,keep_progress=true", "--strategy", "allreduce") == [
        ("async:torus,keep_progress=true", "async"),
        ("allreduce", "sync"),
    ]
    both = planned("--strategies", "allreduce,async", "--strategy", "async:ring,staleness=2")
    assert [label for label, _ in both] == ["allreduce", "async", "async:ring,staleness=2"]
    with pytest.raises(CLIError, match="named twice"):
        planned("--strategies", "allreduce", "--strategy", "allreduce")
    with pytest.raises(fast_core.ConfigError, match="no option 'keep_progres'"):
        planned("--strategy", "async:torus,keep_progres=true")


def test_strategy_lists_are_cut_where_a_new_name_starts_never_inside_a_strategy() -> None:
    from fast_core.cli import bench, parser
    from fast_core.cli.frameworks import FRAMEWORKS

    def planned(*argv: str) -> list[str]:
        runs = bench.plan(FRAMEWORKS["numpy"], parser().parse_args(["bench", "-n", "4", *argv]))
        return [run.label for run in runs]

    every = "dpsgd:ring,every=4"
    coded = "choco:ring,compress=topk:ratio=0.01"
    assert planned("--strategies", f"allreduce,{every},{coded},async") == ["allreduce", every, coded, "async"]
    assert planned("--strategies", every, "allreduce") == [every, "allreduce"]  # spaces separate too
    in_order = planned("--strategy", every, "--strategies", "sgp,async", "--strategy", coded)
    assert in_order == [every, "sgp", "async", coded]
    grouped = "choco:ring,compress=(topk:ratio=0.01),gamma=0.5"
    assert planned("--strategies", f"{grouped},allreduce") == [grouped, "allreduce"]
    with pytest.raises(fast_core.ConfigError, match="if 'ring' is the bare item of the strategy before it"):
        planned("--strategies", "dpsgd:every=4,ring")
    with pytest.raises(fast_core.ConfigError, match="leaves a parenthesis open"):
        planned("--strategies", "choco:compress=(topk")


def test_model_keeps_every_with_its_strategy(capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        fast_main(["model", "-n", "8", "--strategies", "dpsgd:ring,every=4", "ps", "--strategy", "localsgd:every=2"])
    assert ended.value.code == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[3:-1]}
    assert set(rows) == {"dpsgd:ring,every=4", "ps", "localsgd:every=2"}


def test_model_refuses_more_pipeline_stages_than_layers_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        fast_main(["model", "--layers", "dense:10x20,dense:20x2", "--stages", "4"])
    assert ended.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fast: error:")]
    assert len(errors) == 1 and "4 pipeline stages cannot split a model of 2 layers" in errors[0]
    assert "--stages between 1 and 2" in errors[0]
