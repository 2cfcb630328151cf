"""fast_jax.distributed(tensorboard=...): the step's records reach TensorBoard, one run per rank, while it trains."""

from __future__ import annotations

from pathlib import Path

import jax
import optax
import pytest
from test_jax_adapter import batch, loss_fn, make_params

pytest.importorskip("tensorboardX", reason="the tensorboard extra: pip install 'fast-training[tensorboard]'")

from tensorboard_events import check_against_records, read_scalars  # noqa: E402

import fast_jax as fast  # noqa: E402
from fast_core import Engine, LocalCluster  # noqa: E402
from fast_core.config.current import forget_run_config  # noqa: E402

STEPS = 20  # step records at 10 and 20


def _train(engine: Engine, folder: Path) -> list[float]:
    def grad_step(params, data):
        loss, grads = jax.value_and_grad(loss_fn)(params, data)
        return grads, {"loss": loss}  # a "loss" in the metrics goes to the records, with the batch's samples

    sgd = optax.sgd(0.1)
    step = fast.distributed(jax.jit(grad_step), "dpsgd:ring", optimizer=sgd, engine=engine, tensorboard=folder)
    params = make_params()
    params, opt_state = step.start(params, sgd.init(params))
    losses = []
    for k in range(STEPS):
        params, opt_state, metrics = step(params, opt_state, batch(engine.rank, k))
        losses.append(float(metrics["loss"]))
    step.close()
    return losses


def test_the_step_writes_each_ranks_records_to_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a run folder too (as under fast run): every scalar is its record's value; the step records hold the
    step's losses (a "loss" in its metrics) and the running total of samples."""
    monkeypatch.setenv("FAST_RUN_DIR", str(tmp_path / "run"))
    forget_run_config()  # as a new process: this configuration is read at the step's start
    LocalCluster(2, timeout=240).run(_train, tmp_path / "tb")
    check_against_records(tmp_path / "tb", tmp_path / "run")
    for rank in range(2):
        scalars = read_scalars(tmp_path / "tb" / f"rank{rank}")
        assert [step for step, _, _ in scalars["step/bytes_sent"]] == [10, 20]
        assert scalars["close/samples"][-1][2] == 16 * STEPS  # every batch counted
