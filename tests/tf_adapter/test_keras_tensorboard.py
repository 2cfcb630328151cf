"""fast_tf.Callback(tensorboard=...): model.fit's records reach TensorBoard, one run per rank, while it trains."""

from __future__ import annotations

from pathlib import Path

import keras
import pytest
from keras_cases import BATCH, LR, STEPS, make_model, rank_data

pytest.importorskip("tensorboardX", reason="the tensorboard extra: pip install 'fast-training[tensorboard]'")

from tensorboard_events import read_scalars  # noqa: E402

import fast_tf as fast  # noqa: E402
from fast_core import Engine, LocalCluster  # noqa: E402

EPOCHS = 6  # 24 steps: step records at 10 and 20 (every 10 steps by default)


def _fit(engine: Engine, folder: Path) -> dict:
    model = make_model(engine, keras.optimizers.SGD(LR))
    x, y = rank_data(engine.rank)
    callback = fast.Callback("dpsgd:ring", engine=engine, batch_size=BATCH, tensorboard=folder)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[callback])
    return {"steps": callback.worker.step, "loss": history.history["loss"]}


def test_the_callback_writes_each_ranks_step_records_to_tensorboard(tmp_path: Path) -> None:
    results = LocalCluster(2, timeout=60).run(_fit, tmp_path)
    for rank, result in enumerate(results):
        scalars = read_scalars(tmp_path / f"rank{rank}")
        assert result["steps"] == STEPS * EPOCHS
        sent = [(step, value) for step, _, value in scalars["step/bytes_sent"]]
        assert [step for step, _ in sent] == [10, 20] and 0 < sent[0][1] < sent[1][1]  # D-PSGD sends every step
        assert [value for _, _, value in scalars["close/samples"]] == [BATCH * STEPS * EPOCHS]
        # Keras' epoch loss, as the callback records it (Keras reports the float32 mean; the record keeps it)
        assert [value for _, _, value in scalars["epoch/loss"]] == pytest.approx(result["loss"], rel=1e-6)
    assert (tmp_path / "job").is_dir()
