"""TensorBoard scalars (fast_core.observers.tensorboard) agree with the run's records exactly: real runs write both,
the event files are read back (tests/tensorboard_events.py) and every scalar is held to its record's value, step and
wall time."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboardX", reason="the tensorboard extra: pip install 'fast-training[tensorboard]'")

from fast_cli import fast  # noqa: E402
from tensorboard_events import check_against_records, read_scalars  # noqa: E402
from test_survival import train as train_surviving  # noqa: E402
from training import CLASSES, FEATURES, LR, batch, task  # noqa: E402

from fast_core import Budget, ConfigError, LocalCluster, RunConfig, Worker  # noqa: E402
from fast_core.engine import Engine  # noqa: E402
from fast_core.model.numpy_model import SGD, SoftmaxRegression  # noqa: E402
from fast_core.observers.runlog import read_run  # noqa: E402
from fast_core.observers.snapshots import FOLDER as SNAPSHOTS  # noqa: E402
from fast_core.observers.tensorboard import check_folder  # noqa: E402
from fast_core.runtime.consensus_curve import attach_snapshots, record_consensus_curve  # noqa: E402


def _train(engine: Engine, config: RunConfig, steps: int) -> None:
    """A NumPy model under a sample budget, recording as a script does: loss per step, an epoch every 10 steps with
    the consensus distance and a validation accuracy, the consensus curve and a test accuracy at the end."""
    x, y, shards, (x_test, y_test) = task(engine.size)
    model = SoftmaxRegression(FEATURES, CLASSES, optimizer=SGD(LR), seed=engine.rank)
    worker = Worker(model, "dpsgd:ring", engine, config=config, budget=Budget(samples=32 * engine.size * steps))
    snapshots = attach_snapshots(worker, config.run_dir / SNAPSHOTS, 0.01)
    worker.start()
    while n := worker.claim_batch(32):
        xb, yb = batch(x, y, shards[engine.rank], worker.step)
        loss = model.compute_gradients(xb[:n], yb[:n])
        worker.run_step(model.optimizer_step)
        worker.records.step(loss=loss, samples=n)
        if worker.step % 10 == 0:
            worker.group.consensus_distance()
            worker.records.epoch(val_accuracy=model.accuracy(x_test, y_test))
    worker.close()
    worker.records.result(test_accuracy=model.accuracy(x_test, y_test))
    record_consensus_curve(worker, snapshots, lambda: model.accuracy(x_test, y_test))


def test_an_in_process_run_writes_the_records_as_scalars(tmp_path: Path) -> None:
    run_dir, tensorboard = tmp_path / "run", tmp_path / "tb"
    config = RunConfig(run_dir=run_dir, tensorboard=tensorboard, log_every=3)
    LocalCluster(2).run(_train, config, 25)
    runs = check_against_records(tensorboard, run_dir)
    assert len(runs["job"]["job/consensus_distance"]) == 2  # steps 10 and 20
    assert runs["job"]["job/samples_left"][-1][2] == 0.0  # the budget spent
    assert len(runs["job"]["consensus/val_accuracy"]) >= 2
    assert len(runs["rank1"]["epoch/val_accuracy"]) == 2


def test_a_membership_change_is_a_job_scalar(tmp_path: Path) -> None:
    """Rank 1 of 3 is lost at step 12: rank 0 writes the group's new size, the loss and the recovery's seconds."""
    run_dir, tensorboard = tmp_path / "run", tmp_path / "tb"
    cluster = LocalCluster(3, timeout=20, fault_tolerant=True)
    cluster.run(train_surviving, "dpsgd:ring", 1, cluster, False, run_dir, tensorboard)
    (change,) = [r for r in read_run(run_dir)[0] if r["kind"] == "membership"]
    job = read_scalars(tensorboard / "job")
    wall = read_run(run_dir)[0][0]["wall_start"] + change["time"]
    assert job["membership/size"] == [(change["step"], wall, 2.0)]
    assert job["membership/lost"] == [(change["step"], wall, 1.0)]
    assert job["membership/replaced"] == [(change["step"], wall, 0.0)]
    assert job["membership/recovery_seconds"] == [(change["step"], wall, change["recovery_seconds"])]


def test_a_folder_that_cannot_be_written_is_one_line_before_training(tmp_path: Path) -> None:
    blocker, script = tmp_path / "file", tmp_path / "never_run.py"
    blocker.write_text("not a folder")
    script.write_text("raise SystemExit('a rank started')\n")
    folder, model = blocker / "tb", SoftmaxRegression(4, 2)
    with pytest.raises(ConfigError, match=r"TensorBoard folder .*file/tb: cannot write there"):
        LocalCluster(1).run(lambda engine: Worker(model, None, engine, tensorboard=folder))
    with pytest.raises(ConfigError, match="observers= or tensorboard=, not both"):
        LocalCluster(1).run(lambda engine: Worker(model, None, engine, observers=[], tensorboard=tmp_path))
    done = fast("run", "-n", "2", "--tensorboard", str(folder), "--run-dir", str(tmp_path / "run"), str(script))
    assert done.returncode != 0 and done.stderr.startswith("fast: error: TensorBoard folder"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.mpi
def test_fast_run_writes_the_records_as_scalars(tmp_path: Path) -> None:
    """A real ``fast run -n 2 --tensorboard DIR`` of the NumPy example."""
    run_dir, tensorboard = tmp_path / "run", tmp_path / "tb"
    done = fast(
        "run", "-n", "2", "--no-progress", "--tensorboard", str(tensorboard), "--run-dir", str(run_dir),
        "--budget-samples", "3200", "--log-every", "5", "-m", "fast_examples.numpy_digits", timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    runs = check_against_records(tensorboard, run_dir)
    assert runs["rank1"]["step/loss"] and runs["job"]["job/samples_left"][-1][2] == 0.0


def test_a_missing_tensorboardx_is_one_line_naming_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"need tensorboardX: pip install 'fast-training\[tensorboard\]'$"):
        check_folder(tmp_path)


def test_the_writer_loads_no_framework(tmp_path: Path) -> None:
    """tensorboardX imports torch when it is installed; a NumPy rank writing scalars must not pay for it."""
    code = (
        "import sys\nfrom fast_core.observers.tensorboard import TensorBoard\n"
        f"TensorBoard({str(tmp_path)!r}, 0).write({{'kind': 'step', 'step': 1, 'time': 0.5, 'loss': 1.0}})\n"
        "print(','.join(m for m in ('torch', 'tensorflow', 'jax') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
    assert read_scalars(tmp_path / "rank0")["step/loss"] == [(1, 0.5, 1.0)]
