"""The shared work budget's single-process side: its values and their one-line errors, the run configuration and
`fast run`'s flags, the Worker taking the configuration's budget, and the NumPy example under a budget.

The multi-rank behaviour (shared exactly, every rank stops within one step, lockstep keeps its lockstep) is in
cases_budget.py, run on LocalCluster and under mpiexec by test_multirank.py.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
from fast_cli import fast

from fast_core import Budget, ConfigError, LocalCluster, Worker
from fast_core.cli import main as fast_main
from fast_core.config.run import RunConfig
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.observers.runlog import read_run
from fast_core.runtime.budget import MAX_AHEAD, SharedSamples
from fast_core.strategies import Schedule


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, r"Budget\(\): give samples="),
        ({"samples": 0}, r"Budget\(samples=0\)"),
        ({"samples": -5}, r"Budget\(samples=-5\)"),
        ({"samples": 1.5}, r"Budget\(samples=1.5\)"),
        ({"samples": True}, r"Budget\(samples=True\)"),
        ({"samples": "100"}, r"Budget\(samples='100'\)"),
        ({"seconds": 0}, r"Budget\(seconds=0\)"),
        ({"seconds": -1.0}, r"Budget\(seconds=-1.0\)"),
        ({"seconds": math.nan}, r"Budget\(seconds=nan\)"),
        ({"seconds": math.inf}, r"Budget\(seconds=inf\)"),
        ({"samples": 100, "seconds": "abc"}, r"Budget\(seconds='abc'\)"),
        ({"samples": 100, "ahead": 0}, r"Budget\(ahead=0\)"),
        ({"samples": 100, "ahead": 2.5}, r"Budget\(ahead=2.5\)"),
    ],
)
def test_a_bad_budget_is_one_line_naming_the_field_and_a_valid_spelling(kwargs, field) -> None:
    with pytest.raises(ConfigError, match=f"^{field}") as caught:
        Budget(**kwargs)
    assert "\n" not in str(caught.value) and "e.g. " in str(caught.value)


def test_a_budget_keeps_its_values() -> None:
    assert Budget(samples=np.int64(20000)) == Budget(samples=20000)
    assert Budget(seconds=2).seconds == 2.0 and Budget(samples=10, seconds=1.5) == Budget(10, 1.5)
    assert Budget(samples=10).ahead is None and Budget(samples=10).most_ahead == MAX_AHEAD  # adapts by default
    assert Budget(samples=10, ahead=np.int64(4)).ahead == 4 == Budget(samples=10, ahead=4).most_ahead


@pytest.mark.parametrize(
    ("variable", "text"),
    [
        ("FAST_BUDGET_SAMPLES", "abc"),
        ("FAST_BUDGET_SAMPLES", "0"),
        ("FAST_BUDGET_SAMPLES", "-3"),
        ("FAST_BUDGET_SAMPLES", "1.5"),
        ("FAST_BUDGET_SECONDS", "abc"),
        ("FAST_BUDGET_SECONDS", "nan"),
        ("FAST_BUDGET_SECONDS", "0"),
        ("FAST_BUDGET_SECONDS", "-1"),
        ("FAST_BUDGET_SECONDS", "inf"),
    ],
)
def test_a_bad_budget_variable_is_one_line_naming_it(variable: str, text: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}=.*e.g. ") as caught:
        RunConfig.from_environment({variable: text})
    assert "\n" not in str(caught.value)


def test_the_budget_round_trips_through_the_environment() -> None:
    config = RunConfig(budget_samples=20000, budget_seconds=1.5)
    assert RunConfig.from_environment(config.to_environment()) == config
    assert RunConfig.from_environment(RunConfig().to_environment()) == RunConfig()
    assert Budget.from_config(config) == Budget(samples=20000, seconds=1.5)
    assert Budget.from_config(RunConfig()) is None


def _model() -> SoftmaxRegression:
    return SoftmaxRegression(4, 2, optimizer=SGD(0.1))


def test_the_worker_takes_the_configurations_budget(monkeypatch) -> None:
    monkeypatch.setenv("FAST_BUDGET_SAMPLES", "50")

    def train(engine) -> tuple[int, int | None]:
        worker = Worker(_model(), "async:ring", engine, observers=[]).start()
        x, y = np.ones((8, 4)), np.zeros(8, dtype=np.int64)
        while n := worker.claim_batch(8):
            worker.model.compute_gradients(x[:n], y[:n])
            worker.before_step()
            worker.model.optimizer_step()
            worker.after_step()
        worker.close()
        return worker.metrics.samples, worker.metrics.job_samples

    results = LocalCluster(2).run(train)
    assert sum(mine for mine, _ in results) == 50 and {job for _, job in results} == {50}
    assert Worker(_model(), "allreduce", LocalCluster(1).engine(0), budget=Budget(seconds=9)).claims.budget == Budget(
        seconds=9
    )  # one given in code wins over the configuration's


def test_a_rank_whose_grants_come_late_reserves_more_batches_and_the_sum_stays_exact(monkeypatch) -> None:
    """Rank 0's grants take 5 ms (a slow handler) while the other ranks' steps take microseconds (rank 0's 2 ms, so
    it does not spend the budget alone): reservations arrive late, so those ranks reserve more at a time (up to
    MAX_AHEAD), and the job still trains exactly the budget."""
    answer = SharedSamples._answer

    def slow_answer(self, peer, request, reply) -> None:
        time.sleep(0.005)
        answer(self, peer, request, reply)

    monkeypatch.setattr(SharedSamples, "_answer", slow_answer)
    samples = 8 * 60 * 3 + 5

    def train(engine) -> tuple[int, int, int | None]:
        worker = Worker(_model(), "async:ring", engine, observers=[], budget=Budget(samples=samples)).start()
        while worker.claim_batch(8):
            time.sleep(0.002 if engine.rank == 0 else 0.0)
            worker.before_step()
            worker.after_step()
        worker.close()
        return worker.metrics.samples, worker.metrics.job_samples, worker.claims.allowance.ahead

    results = LocalCluster(3).run(train)
    assert all(mine > 0 for mine, _, _ in results) and sum(mine for mine, _, _ in results) == samples
    assert {job for _, job, _ in results} == {samples}
    assert results[0][2] == 1 and all(1 < ahead <= MAX_AHEAD for _, _, ahead in results[1:]), results


def test_an_allreduce_warmup_counts_its_steps_then_the_ranks_share_the_rest() -> None:
    """warmup=W: W lockstep steps (no messages for the budget), then rank 0's counter holds what they left; the
    slow rank 0 does fewer of the asynchronous steps and the sum is still the budget."""
    samples, warmup = 8 * 4 * 30 + 5, 10

    def train(engine) -> tuple[int, int, int]:
        worker = Worker(_model(), f"async:ring,warmup={warmup}", engine, observers=[], budget=Budget(samples=samples))
        worker.start()
        while worker.claim_batch(8):
            time.sleep(0.004 if engine.rank == 0 else 0.001)
            worker.before_step()
            worker.after_step()
        worker.close()
        return worker.step, worker.metrics.samples, worker.metrics.job_samples

    results = LocalCluster(4).run(train)
    steps = [step for step, _, _ in results]
    assert sum(mine for _, mine, _ in results) == samples and {job for _, _, job in results} == {samples}
    assert min(steps) > warmup and steps[0] < min(steps[1:]), steps  # after the warm-up the fast ranks did more


def test_a_lockstep_phase_after_an_asynchronous_one_is_refused_under_a_budget() -> None:
    schedule = Schedule([(5, "async:ring"), (None, "allreduce")])
    with pytest.raises(ConfigError, match=r"lockstep phases must come before its asynchronous ones: phase 0"):
        Worker(_model(), schedule, LocalCluster(1).engine(0), observers=[], budget=Budget(samples=100)).start()


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_claim_batch_wants_a_whole_number_of_samples(size) -> None:
    worker = Worker(_model(), "allreduce", LocalCluster(1).engine(0), observers=[])
    with pytest.raises(ValueError, match=r"^claim_batch\(.*\): give the number of samples of the next batch, >= 1$"):
        worker.claim_batch(size)


def test_a_lockstep_budget_smaller_than_one_step_of_the_job_says_so_on_every_rank() -> None:
    def train(engine) -> None:
        worker = Worker(_model(), "allreduce", engine, observers=[], budget=Budget(samples=10)).start()
        worker.claim_batch(8)

    with pytest.raises(ConfigError, match=r"^Budget\(samples=10\) is less than one step of this job \(16 samples"):
        LocalCluster(2).run(train)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budget-samples", "0"], "argument --budget-samples: invalid positive value: '0'"),
        (["--budget-seconds", "nan"], "--budget-seconds nan: give the wall-clock seconds to train, > 0 (e.g. 60)"),
        (["--budget-seconds", "-2"], "--budget-seconds -2: give the wall-clock seconds to train, > 0 (e.g. 60)"),
    ],
)
def test_bad_budget_flags_are_errors_before_anything_starts(tmp_path: Path, monkeypatch, capsys, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print('never run')\n")
    with pytest.raises(SystemExit) as exit_:
        fast_main(["run", "-n", "2", *flags, "x.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.mpi
def test_the_numpy_example_under_fast_run_spends_a_shared_budget_exactly(tmp_path: Path) -> None:
    run = ["run", "-n", "2", "--strategy", "async:ring", "--budget-samples", "3001", "--run-dir", str(tmp_path / "r")]
    done = fast(*run, "-m", "fast_examples.numpy_digits")
    assert done.returncode == 0, done.stderr
    assert "budget 3001 samples for the job" in done.stderr
    spent = re.search(r"budget spent: (\d+) samples trained by the job .*steps per rank \[(\d+), (\d+)\]", done.stdout)
    assert spent is not None and int(spent.group(1)) == 3001, done.stdout
    ranks = read_run(tmp_path / "r")
    closes = [next(r for r in records if r["kind"] == "close") for _, records in sorted(ranks.items())]
    assert sum(c["samples"] for c in closes) == 3001  # what each rank recorded adds up to the budget
    assert [c["step"] for c in closes] == [int(spent.group(2)), int(spent.group(3))]
