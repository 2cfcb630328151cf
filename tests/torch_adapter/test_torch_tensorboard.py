"""fast_torch's ``tensorboard=`` and the torch example under ``fast run --tensorboard``: the scalars are the records."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("tensorboardX", reason="the tensorboard extra: pip install 'fast-training[tensorboard]'")

from fast_cli import fast  # noqa: E402
from tensorboard_events import check_against_records, read_scalars  # noqa: E402

import fast_torch  # noqa: E402
from fast_core import LocalCluster  # noqa: E402
from fast_core.engine import Engine  # noqa: E402

STEPS = 20


def _train(engine: Engine, folder: Path) -> list[float]:
    model = torch.nn.Linear(4, 2)  # rank 0's start is every rank's
    opt = fast_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model, "dpsgd:ring", engine=engine, tensorboard=folder
    )
    losses, generator = [], torch.Generator().manual_seed(engine.rank)  # the ranks are threads: one generator each
    for _ in range(STEPS):
        x, y = torch.randn(8, 4, generator=generator), torch.randint(0, 2, (8,), generator=generator)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.fast_worker.records.step(loss=loss.item(), samples=8)  # before the step: it counts in the step's record
        opt.step()
    return losses


def test_the_optimizer_writes_its_records_to_tensorboard(tmp_path: Path) -> None:
    """No run folder: the scalars alone, each step record's loss the mean of its 10 steps."""
    losses = LocalCluster(2).run(_train, tmp_path)
    for rank, mine in enumerate(losses):
        scalars = read_scalars(tmp_path / f"rank{rank}")
        expected = [(10, sum(mine[:10]) / 10), (20, sum(mine[10:]) / 10)]
        assert [(step, value) for step, _, value in scalars["step/loss"]] == expected
        assert [value for _, _, value in scalars["step/samples"]] == [80.0, 160.0]
    assert (tmp_path / "job").is_dir() and not (tmp_path / "rank2").exists()


@pytest.mark.mpi
def test_the_torch_example_under_fast_run_writes_tensorboard(tmp_path: Path) -> None:
    """``fast run -n 2 --tensorboard`` of examples/torch_mnist1d.py: every scalar is its record's value."""
    run_dir, tensorboard = tmp_path / "run", tmp_path / "tb"
    done = fast(
        "run", "-n", "2", "--no-progress", "--tensorboard", str(tensorboard), "--run-dir", str(run_dir),
        "--log-every", "5",
        "-m", "fast_examples.torch_mnist1d", "--data", "digits", "--epochs", "2", "--snapshot-every", "0.05",
        timeout=200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    runs = check_against_records(tensorboard, run_dir)
    assert len(runs["rank0"]["epoch/val_accuracy"]) >= 2 and len(runs["job"]["consensus/val_accuracy"]) >= 3
    assert runs["job"]["job/consensus_distance"] and runs["job"]["job/samples_left"][-1][2] < 2 * 16
