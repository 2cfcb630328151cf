"""The JAX/Flax language model (fast_examples.jax_lm) at its tiny size: the same parameter count as the torch
twin's formula, and a real 2-rank job under `fast run` whose consensus model's loss falls. No timed assertion."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from fast_cli import fast

from fast_core.observers.runlog import read_run
from fast_examples.flax_gpt import init_params
from fast_examples.lm_data import SIZES


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_the_flax_model_has_the_parameters_its_size_names(size: str) -> None:
    shapes = jax.eval_shape(lambda: init_params(SIZES[size]))
    assert sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(shapes)) == SIZES[size].parameters()


@pytest.mark.mpi
def test_fast_run_trains_the_tiny_jax_lm_and_reports_the_consensus_models_loss(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = fast("run", "-n", "2", "--strategy", "allreduce", "--run-dir", str(run_dir), "-m", "fast_examples.jax_lm",
                "--size", "tiny", "--epochs", "3", timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    printed = re.search(r"consensus model: validation loss ([0-9.]+) nats/byte, perplexity ([0-9.]+)", done.stdout)
    assert printed is not None, done.stdout
    val_loss = float(printed.group(1))
    assert float(printed.group(2)) == pytest.approx(math.exp(val_loss), rel=1e-3)
    ranks = read_run(run_dir)
    steps = [r for r in ranks[0] if r["kind"] == "step"]
    assert steps[0]["loss"] > steps[-1]["loss"] + 0.5 and val_loss < 3.5, (steps, val_loss)  # it learned
    result = next(r for r in ranks[0] if r["kind"] == "result")
    assert result["val_loss"] == pytest.approx(val_loss, abs=1e-4)


def test_a_missing_corpus_gets_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "fast_examples.jax_lm", "--corpus", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"jax_lm: corpus {tmp_path / 'none'}: no such file or folder"
