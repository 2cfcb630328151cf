"""The torch example under `fast run` as a user runs it: a shared budget of global epochs, the consensus model's
validation accuracy over time in rank 0's records, and the DDP baseline still running under the same budget.

Each launch pays the torch import on every rank (about 2.6 s each, 4 ranks on 2 cores). No assertion is on an
absolute time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fast_cli import fast

from fast_core.observers.runlog import read_run

DIGITS_PASS = 20 * 16
"""Samples of one rank's pass over its shard of the digits' 1293 training samples on 4 ranks (323 each, 20 batches
of 16); a global epoch is 4 of them on 4 ranks, 2 x 40 batches on 2."""


def _run(tmp_path: Path, *flags: str, script: tuple[str, ...]) -> tuple[str, dict[int, list[dict]]]:
    run_dir = tmp_path / "run"
    done = fast("run", *flags, "--run-dir", str(run_dir), "-m", "fast_examples.torch_mnist1d", *script, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, read_run(run_dir)


def _spent(output: str) -> tuple[int, list[int]]:
    found = re.search(r"budget spent: (\d+) samples trained by the job .*steps per rank \[([\d, ]+)\]", output)
    assert found is not None, output
    return int(found.group(1)), [int(s) for s in found.group(2).split(",")]


def _check_consensus(ranks: dict[int, list[dict]], output: str) -> list[dict]:
    """Rank 0's "consensus" records: from the common start (point 0, the start model) to the job's stop, the
    last one the final consensus model; no other rank writes any. The result is the consensus model's."""
    consensus = [r for r in ranks[0] if r["kind"] == "consensus"]
    times = [r["time"] for r in consensus]
    assert len(consensus) >= 3 and times[0] == 0.0 and times == sorted(times), consensus
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in consensus)
    assert consensus[0]["val_accuracy"] < 0.5 < consensus[-1]["val_accuracy"], consensus  # it learned
    assert not any(r["kind"] == "consensus" for rank, records in ranks.items() if rank for r in records)
    result = next(r for r in ranks[0] if r["kind"] == "result")
    printed = float(re.search(r"test accuracy of the averaged model: ([0-9.]+)", output).group(1))
    assert result["test_accuracy"] == pytest.approx(printed, abs=1e-4)
    return consensus


@pytest.mark.mpi
def test_async_with_a_straggler_spends_the_global_epochs_exactly_and_records_the_consensus_curve(tmp_path) -> None:
    flags = ("-n", "4", "--straggler", "3", "--strategy", "async:torus")
    # snapshots every 0.05 s: the whole job can take 0.3 s here, and the curve needs 3 points (one CI run had 2)
    script = ("--data", "digits", "--epochs", "3", "--snapshot-every", "0.05")
    output, ranks = _run(tmp_path, *flags, script=script)
    budget = 3 * 4 * DIGITS_PASS
    assert f"budget {budget} samples (3 global epochs)" in output
    job, steps = _spent(output)
    assert job == budget  # an asynchronous sample budget is spent exactly
    closes = [next(r for r in records if r["kind"] == "close") for records in ranks.values()]
    assert sum(c["samples"] for c in closes) == budget and [c["step"] for c in closes] == steps
    assert steps[3] < max(steps[:3]), steps  # the straggler trained less of the budget than the fastest rank
    epochs = [r for r in ranks[0] if r["kind"] == "epoch"]
    assert len(epochs) == -(-closes[0]["samples"] // DIGITS_PASS)  # one per pass of rank 0 over its shard
    consensus = _check_consensus(ranks, output)
    assert consensus[-1]["val_accuracy"] > 0.8, consensus


@pytest.mark.mpi
def test_ddp_runs_the_same_steps_on_every_rank_under_the_budget(tmp_path) -> None:
    output, ranks = _run(tmp_path, "-n", "2", script=("--data", "digits", "--epochs", "2", "--ddp"))
    assert "strategy DDP (gloo)" in output
    job, steps = _spent(output)
    assert steps == [80, 80] and job == 2 * 2 * 40 * 16  # DDP is lockstep: 2 passes of 40 batches on each rank
    assert len(re.findall(r"^\[0\] epoch +\d+  loss [0-9.]+  consensus distance 0.00e\+00", output, re.MULTILINE)) == 2
    consensus = _check_consensus(ranks, output)
    assert consensus[-1]["val_accuracy"] > 0.8, consensus
