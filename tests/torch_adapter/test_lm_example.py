"""The language-model example (fast_examples.torch_lm) at its tiny size: a real 2-rank job under `fast run` and
`fast bench --framework lm`, the model's exact parameter counts at every size, and its bad-input lines.

Each launch pays the torch import on both ranks; the runs train 60 steps of a 0.11M-parameter model. No assertion
is on an absolute time.
"""

from __future__ import annotations

import csv
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fast_cli import fast
from mpirun import mpiexec

from fast_core import Budget
from fast_core.observers.runlog import read_run
from fast_examples import torch_lm
from fast_examples.lm_data import SIZES, check_fits, estimate_bytes
from fast_examples.torch_gpt import build_model

BYTE_ENTROPY_START = math.log(256)
"""An untrained byte model's loss: ln 256 = 5.55 nats."""


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_model_has_the_parameters_its_size_names(size: str) -> None:
    with torch.device("meta"):  # no memory: gpt2 is 124M parameters
        model = build_model(SIZES[size])
    assert sum(p.numel() for p in model.parameters()) == SIZES[size].parameters()
    if size == "gpt2":
        assert SIZES[size].parameters() == 124_439_808  # GPT-2 small's published count
    assert model.embed.weight is not None and not hasattr(model, "head")  # the head is the embedding (tied)


def test_a_size_that_does_not_fit_is_refused_with_its_estimate() -> None:
    gpt2 = SIZES["gpt2"]
    need = estimate_bytes(gpt2, 128, 1)
    assert 6 * 4 * gpt2.parameters() < need < 4e9  # six float32 copies of 124M parameters plus activations
    assert check_fits(gpt2, 128, 1, ranks_here=2, available=2 * need) is None
    refusal = check_fits(gpt2, 128, 1, ranks_here=2, available=need)
    assert refusal is not None and f"{2 * need / 2**30:.1f} GiB for 2 rank(s)" in refusal and "\n" not in refusal


def test_cosine_decays_the_learning_rate_to_a_tenth_over_the_budgets_steps() -> None:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=3e-3)
    schedule = torch_lm.cosine_schedule(optimizer, Budget(samples=2 * 8 * 100), samples_per_step=2 * 8)  # 100 steps
    rates = []
    for _ in range(100):
        optimizer.step()
        schedule.step()
        rates.append(optimizer.param_groups[0]["lr"])
    k = np.arange(1, 101)
    np.testing.assert_allclose(rates, 3e-4 + (3e-3 - 3e-4) * (1 + np.cos(np.pi * k / 100)) / 2, rtol=1e-9, atol=1e-12)
    with pytest.raises(SystemExit, match="--cosine needs the run's steps"):
        torch_lm.cosine_schedule(optimizer, Budget(seconds=5.0), samples_per_step=16)


@pytest.mark.mpi
def test_fast_run_trains_the_tiny_lm_and_reports_the_consensus_models_loss(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = ("--size", "tiny", "--epochs", "3", "--snapshot-every", "0.2")
    done = fast("run", "-n", "2", "--strategy", "dpsgd:ring", "--run-dir", str(run_dir), "-m", "fast_examples.torch_lm",
                *script, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    printed = re.search(r"consensus model: validation loss ([0-9.]+) nats/byte, perplexity ([0-9.]+)", done.stdout)
    assert printed is not None, done.stdout
    val_loss, perplexity = float(printed.group(1)), float(printed.group(2))
    assert perplexity == pytest.approx(math.exp(val_loss), rel=1e-3)
    ranks = read_run(run_dir)
    steps = [r for r in ranks[0] if r["kind"] == "step"]
    assert steps[0]["loss"] > steps[-1]["loss"] + 0.5 and val_loss < 3.5, (steps, val_loss)  # it learned
    result = next(r for r in ranks[0] if r["kind"] == "result")
    assert result["val_loss"] == pytest.approx(val_loss, abs=1e-4) and 0.1 < result["test_accuracy"] < 1.0
    curve = [r for r in ranks[0] if r["kind"] == "consensus" and "val_loss" in r]
    assert len(curve) >= 2 and curve[0]["time"] == 0.0, curve
    assert curve[0]["val_loss"] == pytest.approx(BYTE_ENTROPY_START, abs=0.3) and curve[-1]["val_loss"] < 4.0
    closes = [next(r for r in records if r["kind"] == "close") for records in ranks.values()]
    assert [c["step"] for c in closes] == [60, 60]  # 3 epochs of 20 steps, lockstep


@pytest.mark.mpi
@pytest.mark.timeout(380)  # three launches of torch on 2 ranks: the bench's own 360 s must not be cut at 300
def test_fast_bench_ranks_the_lm_against_ddp(tmp_path: Path) -> None:
    options = "--framework lm -n 2 --strategies allreduce --compare-ddp --epochs 2"
    done = fast("bench", *options.split(), "--run-dir", str(tmp_path), "--", "--size", "tiny", timeout=360)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "results.csv") as f:
        rows = {row["label"]: row for row in csv.DictReader(f)}
    assert list(rows) == ["allreduce", "DDP"]
    for row in rows.values():
        assert int(row["steps"]) == 40 and 0.1 < float(row["final_accuracy"]) < 1.0
    # DDP and fast_torch's all-reduce train the same model on the same batches: the same result up to rounding
    assert float(rows["DDP"]["final_accuracy"]) == pytest.approx(float(rows["allreduce"]["final_accuracy"]), abs=0.01)


def _bad(ranks: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "fast_examples.torch_lm", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.mpi
def test_a_missing_corpus_gets_one_line_on_every_rank(tmp_path: Path) -> None:
    done = _bad(2, "--corpus", str(tmp_path / "nowhere"))
    assert done.returncode != 0
    # mpiexec forwards both ranks' stderr, which may share a line
    assert done.stderr.count(f"torch_lm: corpus {tmp_path / 'nowhere'}: no such file or folder") == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_an_empty_corpus_and_a_size_too_big_are_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(SystemExit) as empty:  # in this process: both are refused before MPI or the model start
        torch_lm.main(["--corpus", str(tmp_path / "empty")])
    assert str(empty.value) == f"torch_lm: corpus {tmp_path / 'empty'}: no text in its 1 file(s) (.py, .txt, .md, .rst)"
    with pytest.raises(SystemExit) as big:
        torch_lm.main(["--size", "gpt2", "--seq", "1024", "--batch-size", "100000"])
    assert re.fullmatch(
        r"torch_lm: size gpt2 \(124\.4M parameters.*needs about [0-9.]+ GiB .* available.*", str(big.value)
    )
