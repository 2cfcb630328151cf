"""fast_tf.horovod: a Keras script written for Horovod runs with one changed import and trains by Horovod's rule.

Horovod is not installed here, so its rule is computed in NumPy: every rank starts from rank 0's weights, each
step applies the mean of the ranks' batch gradients, at the learning rate Horovod's warm-up gives that batch
(initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1), epoch fractional), and the epoch's logs are the
same on every rank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from docblocks import documented_commands
from fast_cli import fast
from mpirun import run_mpi
from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"
BATCH, EPOCHS, WARMUP, LR, RANKS = 32, 3, 2, 0.2, 2


def _horovod_rule(kernel: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[float]]:
    digits = load_digits()
    x_all, y_all = digits.data[:256] / 16.0, digits.target[:256]
    shards = [(x_all[r::RANKS], y_all[r::RANKS]) for r in range(RANKS)]
    steps = len(shards[0][1]) // BATCH
    kernel, bias, rates = kernel.astype(np.float64), bias.astype(np.float64), []
    for epoch in range(EPOCHS):
        for batch in range(steps):
            progress = epoch + batch / steps
            rate = LR / RANKS * (progress * (RANKS - 1) / WARMUP + 1) if progress < WARMUP else LR
            rates.append(rate)
            grads = []
            for x, y in shards:
                xb, yb = x[batch * BATCH : (batch + 1) * BATCH], y[batch * BATCH : (batch + 1) * BATCH]
                logits = xb @ kernel + bias
                p = np.exp(logits - logits.max(axis=1, keepdims=True))
                p /= p.sum(axis=1, keepdims=True)
                p[np.arange(len(yb)), yb] -= 1.0  # d(mean cross-entropy)/d(logits) * batch
                grads.append((xb.T @ p / len(yb), p.mean(axis=0)))
            kernel -= rate * np.mean([g[0] for g in grads], axis=0)
            bias -= rate * np.mean([g[1] for g in grads], axis=0)
    return kernel, bias, rates


@pytest.mark.mpi
def test_a_horovod_keras_script_trains_by_horovods_rule(tmp_path: Path) -> None:
    out = tmp_path / "result.npz"
    run_mpi(RANKS, HERE / "horovod_keras_script.py", str(out), timeout=180)
    result = np.load(out)
    kernel, bias, rates = _horovod_rule(result["start_kernel"], result["start_bias"])
    np.testing.assert_allclose(result["rates"], rates, rtol=1e-6)
    np.testing.assert_allclose(result["kernel"], kernel, atol=2e-5)
    np.testing.assert_allclose(result["bias"], bias, atol=2e-5)
    assert np.abs(result["kernel"] - result["start_kernel"]).max() > 0.01  # it trained
    first, second = json.loads(str(result["histories"]))
    assert first == second and len(first["loss"]) == EPOCHS  # the metrics averaged: one history for the job


@pytest.mark.mpi
@pytest.mark.parametrize("command", documented_commands("docs/guides/horovod.md", "horovod_keras_mnist"), ids=" ".join)
def test_the_documented_horovod_keras_example_learns(command: list[str]) -> None:
    """docs/guides/horovod.md's two Keras commands (all-reduce for 3 epochs: past the warm-up, then D-PSGD)."""
    done = fast(*command[1:], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    accuracy = float(re.search(r"Test accuracy: ([0-9.]+)", done.stdout).group(1))
    if "--strategy" in command:
        assert accuracy > 0.5, done.stdout
    else:
        assert accuracy > 0.8, done.stdout
        assert "finished gradual learning rate warmup to 0.002" in done.stdout


def test_what_fast_cannot_honour_is_refused_with_a_reason() -> None:
    import keras

    import fast_tf.horovod as hvd

    with pytest.raises(ValueError, match="Adasum is not supported by FAST"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="backward_passes_per_step > 1 is not supported"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    with pytest.raises(AttributeError, match="keras.models.load_model"):
        hvd.load_model  # noqa: B018 - the attribute access is the test
    with pytest.raises(AttributeError, match="Python ints, constants in a tf.function"):
        hvd.size_op  # noqa: B018
    with pytest.raises(AttributeError, match="BatchNormalization's statistics stay each rank's own"):
        hvd.SyncBatchNormalization  # noqa: B018
    with pytest.raises(AttributeError, match="fast run --profile"):
        hvd.stop_timeline  # noqa: B018
    assert hvd.mpi_threads_supported()
    with pytest.raises(TypeError, match="for lists or dicts of them use fast_tf.average"):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match="needs hvd.callbacks.BroadcastGlobalVariablesCallback"):
        model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
        model.compile(loss="mse", optimizer="sgd")
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), callbacks=[hvd.callbacks.MetricAverageCallback()], verbose=0)


@pytest.mark.parametrize("correction", [True, False])
def test_momentum_correction_is_said_not_applied_when_the_optimizer_has_momentum(correction: bool, caplog) -> None:
    import keras

    import fast_tf.horovod as hvd

    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    warmup = hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1, momentum_correction=correction)
    with caplog.at_level("WARNING", logger="fast_tf"):
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), callbacks=[warmup], verbose=0)
    assert ("momentum_correction=True is not applied" in caplog.text) == correction, caplog.text
