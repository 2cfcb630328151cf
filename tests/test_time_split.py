"""``fast run --profile``: each rank's time split by phase, and each phase into on a core, waiting for a core and
blocked, checked against work of known kind and length (a busy loop is on a core, a sleep is blocked); the table
the launcher prints; and a split that is off costs nothing and writes nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fast_cli import fast
from training import CLASSES, FEATURES, LR, batch, task

from fast_core import LocalCluster, RunConfig, Worker
from fast_core.cli.profile import profile_table
from fast_core.engine import Engine
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.observers.runlog import read_run
from fast_core.runtime.time_split import PHASES, TimeSplit


def busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_phase_is_on_a_core_and_a_sleeping_one_blocked() -> None:
    split = TimeSplit()
    split.enter("compute")
    busy(0.15)
    split.enter("exchange")
    time.sleep(0.2)
    with split.during("budget"):
        time.sleep(0.05)
    assert split.phase == "exchange"  # back where the budget's claim interrupted it
    summary = split.summary()
    compute = {part: summary[f"time_compute_{part}"] for part in ("wall", "cpu", "core_wait", "blocked")}
    assert compute["cpu"] == pytest.approx(0.15, abs=0.02)
    assert compute["wall"] == pytest.approx(compute["cpu"] + compute["core_wait"] + compute["blocked"], abs=1e-6)
    assert compute["blocked"] < 0.05
    assert summary["time_exchange_blocked"] == pytest.approx(0.2, abs=0.05)  # sleeping: neither on nor waiting
    assert summary["time_exchange_cpu"] < 0.02
    assert summary["time_budget_wall"] == pytest.approx(0.05, abs=0.03)
    phases_wall = sum(summary[f"time_{phase}_wall"] for phase in PHASES)
    assert phases_wall == pytest.approx(summary["time_wall"], rel=1e-9)  # every moment in exactly one phase


def test_another_threads_cpu_is_counted_apart_from_the_trainers() -> None:
    split = TimeSplit()
    helper = threading.Thread(target=busy, args=(0.2,))
    helper.start()
    helper.join()
    summary = split.summary()
    assert summary["time_other_threads_cpu"] == pytest.approx(0.2, abs=0.05)
    assert summary["time_start_cpu"] < 0.05  # the trainer only waited for it


def _train(engine: Engine, config: RunConfig, update_pause: float) -> None:
    x, y, shards, _ = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    worker = Worker(model, "dpsgd:ring", engine, config=config).start()  # the split begins here
    for step in range(6):
        model.compute_gradients(*batch(x, y, shards[engine.rank], step))
        busy(0.01)  # a model's compute
        worker.run_step(lambda: (model.optimizer_step(), time.sleep(update_pause)))
    worker.close()


@pytest.mark.parametrize("profile", [True, False])
def test_a_workers_close_record_splits_its_time_when_asked(tmp_path: Path, profile: bool) -> None:
    config = RunConfig(run_dir=tmp_path, profile=profile)
    LocalCluster(2, timeout=60).run(_train, config, 0.02)
    for records in read_run(tmp_path).values():
        close = next(r for r in records if r["kind"] == "close")
        if not profile:
            assert not any(key.startswith("time_") for key in close), close
            continue
        assert close["time_update_wall"] >= 6 * 0.02 and close["time_update_blocked"] >= 0.1  # the sleeps
        assert close["time_compute_cpu"] >= 6 * 0.01 - 0.005  # the busy loops (and the gradients)
        assert close["time_exchange_wall"] > 0 and close["time_measurement_wall"] > 0
        assert sum(close[f"time_{phase}_wall"] for phase in PHASES) == pytest.approx(close["time_wall"], rel=1e-9)


def test_the_table_takes_a_stragglers_sleep_out_of_measurement() -> None:
    close = {"time_wall": 10.0, "straggler_slept": 3.0, "time_other_threads_cpu": 0.5}
    for phase in PHASES:
        close.update({f"time_{phase}_{part}": 0.0 for part in ("wall", "cpu", "core_wait", "blocked")})
    close.update(time_compute_wall=5.0, time_compute_cpu=5.0, time_measurement_wall=3.5, time_measurement_cpu=0.4)
    close.update(time_measurement_blocked=3.1)
    rows = {line.split(" | ")[1]: line for line in profile_table({3: close}).splitlines()[2:]}
    assert rows["compute"] == "| 3 | compute | 5.000 | 50.0% | 5.000 | 0.000 | 0.000 |"
    assert rows["measurement"] == "| 3 | measurement | 0.500 | 5.0% | 0.400 | 0.000 | 0.100 |"
    assert rows["straggler's sleep"].startswith("| 3 | straggler's sleep | 3.000 | 30.0% |")
    assert rows["other threads' CPU"].startswith("| 3 | other threads' CPU | 0.500 | 5.0% |")


@pytest.mark.mpi
def test_fast_run_profile_prints_every_ranks_split(tmp_path: Path) -> None:
    run = ["run", "-n", "2", "--profile", "--no-progress", "--run-dir", str(tmp_path / "r")]
    done = fast(*run, "-m", "fast_examples.numpy_digits", "--epochs", "1", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "where each rank's time went" in out, out
    for rank in (0, 1):
        for phase in PHASES:
            assert f"| {rank} | {phase} | " in out, out
        assert f"| {rank} | other threads' CPU | " in out
