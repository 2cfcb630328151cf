"""The JAX example under `fast run`: a shared budget of global epochs spent exactly under an asynchronous strategy
with a straggler, and the consensus model's validation accuracy over time in rank 0's records. No assertion is on
an absolute time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fast_cli import fast

from fast_core.observers.runlog import read_run


@pytest.mark.mpi
def test_the_jax_example_spends_the_global_epochs_and_records_the_consensus_curve(tmp_path: Path) -> None:
    run = ["run", "-n", "2", "--straggler", "3", "--strategy", "async:ring", "--run-dir", str(tmp_path / "r")]
    done = fast(*run, "-m", "fast_examples.jax_digits", "--epochs", "3", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    budget = 3 * 2 * 640  # 3 global epochs: 2 shards of 646 digits, 40 batches of 16 each
    spent = re.search(r"budget spent: (\d+) samples trained by the job .*steps per rank \[([\d, ]+)\]", done.stdout)
    assert spent is not None and int(spent.group(1)) == budget, done.stdout
    ranks = read_run(tmp_path / "r")
    closes = [next(r for r in records if r["kind"] == "close") for records in ranks.values()]
    assert sum(c["samples"] for c in closes) == budget
    assert [c["step"] for c in closes] == [int(s) for s in spent.group(2).split(",")]
    consensus = [r for r in ranks[0] if r["kind"] == "consensus"]
    times = [r["time"] for r in consensus]
    assert len(consensus) >= 3 and times[0] == 0.0 and times == sorted(times), consensus
    assert consensus[0]["val_accuracy"] < 0.5 and consensus[-1]["val_accuracy"] > 0.8, consensus
    result = next(r for r in ranks[0] if r["kind"] == "result")
    printed = float(re.search(r"test accuracy of the averaged model: ([0-9.]+)", done.stdout).group(1))
    assert result["test_accuracy"] == pytest.approx(printed, abs=1e-4) and printed > 0.85
