"""fast simulate: the virtual-time engine's timing against the link model's formulas, its collectives against NumPy,
FAST's strategies giving the same numbers on it as on the in-process engine, determinism, deadlock detection."""

from __future__ import annotations

import numpy as np
import pytest

from fast_core import Worker
from fast_core.config.run import RunConfig
from fast_core.engine.local import LocalCluster
from fast_core.errors import ConfigError, PeerTimeout
from fast_core.model.numpy_model import SGD, SoftmaxRegression
from fast_core.simulate import ComputeTimes, LinkModel, SimCluster, Simulation, parse_rate, simulate
from fast_core.simulate.run import run_threads

LINKS = LinkModel(bandwidth=1e6, latency=1e-3)  # 1 MB/s, 1 ms: times easy to compute by hand


def test_a_message_lands_after_latency_plus_size_over_bandwidth() -> None:
    def body(engine):
        if engine.rank == 0:
            engine.compute(0.5)
            engine.wait(engine.isend(np.ones(1000, dtype=np.uint8), 1))
            return engine.now
        buf = np.zeros(1000, dtype=np.uint8)
        engine.wait(engine.irecv(buf, 0))
        return engine.now, int(buf.sum())

    sent, (received, total) = SimCluster(2, LINKS).run(body)
    assert received == pytest.approx(0.5 + 1e-3 + 1000 / 1e6)
    assert sent == pytest.approx(received)  # a send completes when its message has landed
    assert total == 1000


def test_messages_into_one_link_queue_one_after_another() -> None:
    """Three workers push 1 kB to rank 0 at t=0: its incoming link takes them one at a time (a server's link)."""

    def body(engine):
        if engine.rank == 0:
            times = []
            for peer in (1, 2, 3):
                engine.wait(engine.irecv(np.zeros(1000, dtype=np.uint8), peer))
                times.append(engine.now)
            return times
        engine.wait(engine.isend(np.zeros(1000, dtype=np.uint8), 0))
        return None

    times = SimCluster(4, LINKS).run(body)[0]
    assert times == pytest.approx([0.002, 0.003, 0.004])


@pytest.mark.parametrize(
    ("algorithm", "seconds"),
    [("ring", 2 * 3 * (1e-3 + 2000 / 4 / 1e6)), ("halving", 2 * 2 * 1e-3 + 2 * 3 / 4 * 2000 / 1e6)],
)
def test_allreduce_sums_and_costs_its_algorithm(algorithm: str, seconds: float) -> None:
    def body(engine):
        engine.compute(0.1 * engine.rank)  # the last rank joins at 0.3
        buf = np.arange(250, dtype=np.float64) * (engine.rank + 1)
        engine.allreduce(buf)
        return buf, engine.now

    results = SimCluster(4, LinkModel(1e6, 1e-3, allreduce=algorithm)).run(body)
    for buf, now in results:
        np.testing.assert_array_equal(buf, np.arange(250) * 10.0)
        assert now == pytest.approx(0.3 + seconds)


def test_a_wait_nothing_can_complete_names_the_rank_instead_of_hanging() -> None:
    def body(engine):
        if engine.rank == 0:
            engine.wait(engine.irecv(np.zeros(4), 1, tag=5))

    with pytest.raises(PeerTimeout, match=r"rank\(s\) \[1\]"):
        SimCluster(2, LINKS).run(body)


def _train(engine, strategy: str, steps: int = 6, compute=None) -> np.ndarray:
    model = SoftmaxRegression(8, 3, optimizer=SGD(0.3), seed=engine.rank)
    rng = np.random.default_rng(engine.rank)
    worker = Worker(model, strategy, engine, config=RunConfig()).start()
    for _ in range(steps):
        model.compute_gradients(rng.normal(size=(5, 8)), rng.integers(0, 3, 5))
        if compute is not None:
            compute(engine)
        worker.before_step()
        model.optimizer_step()
        worker.after_step()
    worker.close()
    return model.params().copy()


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd:ring", "sgp:exp1", "diloco:period=2", "ps:servers=2"])
def test_lockstep_strategies_give_the_in_process_engine_s_numbers(strategy: str) -> None:
    """The strategy code runs unchanged: same parameters to the last bit as on LocalCluster."""
    local = LocalCluster(4, timeout=30).run(lambda engine: _train(engine, strategy))
    simulated = SimCluster(4, LINKS).run(lambda engine: _train(engine, strategy, compute=lambda e: e.compute(0.01)))
    for a, b in zip(local, simulated, strict=True):
        np.testing.assert_array_equal(a, b)


def test_asynchronous_averaging_without_delay_equals_dpsgd() -> None:
    """Equal compute times and messages faster than a step: every neighbour's newest parameters are those of the
    step before, which is D-PSGD's rule (keep_progress mixes differences, the same numbers)."""
    fast = LinkModel(bandwidth=1e9, latency=1e-6)
    tick = lambda engine: engine.compute(0.01)  # noqa: E731
    dpsgd = SimCluster(4, fast).run(lambda engine: _train(engine, "dpsgd:ring", compute=tick))
    averaging = SimCluster(4, fast).run(lambda engine: _train(engine, "async:ring", compute=tick))
    for a, b in zip(dpsgd, averaging, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_a_simulation_is_the_same_for_a_seed_and_asynchronous_jobs_outrun_a_straggler() -> None:
    compute = ComputeTimes(step_seconds=0.01, step_spread=0.3, stragglers={1: 4.0})
    runs = {
        s: simulate(Simulation(strategy=s, workers=6, steps=30, compute=compute))
        for s in ("allreduce", "async:ring", "easgd:synchronous=false")
    }
    again = simulate(Simulation(strategy="async:ring", workers=6, steps=30, compute=compute))
    assert [(p.time, p.accuracy) for p in again.curve] == [(p.time, p.accuracy) for p in runs["async:ring"].curve]
    # all-reduce waits for the straggler at every step: 30 of its steps take at least 30 x 4 x 10 ms
    assert runs["allreduce"].finish > 1.2
    for name in ("async:ring", "easgd:synchronous=false"):
        assert runs[name].finish < 0.6 * runs["allreduce"].finish
        assert runs[name].final_accuracy > 0.6


def test_the_simulator_follows_a_real_in_process_run() -> None:
    """Compute slept for real on LocalCluster threads against the same job simulated: the same final model for a
    lockstep strategy, and the job's time no shorter and not 60% longer (the real one adds Python's own time per
    step: up to 8 ms on a loaded machine, so a step computes 40 ms, 4x the default, to keep that a small part)."""
    compute = ComputeTimes(step_seconds=0.04)
    setup = Simulation(strategy="allreduce", workers=3, steps=25, links=LinkModel(5e9, 5e-6), compute=compute)
    virtual, real = simulate(setup), run_threads(setup)
    assert virtual.final_accuracy == real.final_accuracy
    assert virtual.bytes_per_worker_step == real.bytes_per_worker_step
    assert 1.0 <= real.finish / virtual.finish < 1.6


def test_hundreds_of_workers_run() -> None:
    result = simulate(Simulation(strategy="dpsgd:ring", workers=256, steps=3, eval_every=0.01))
    assert result.curve[-1].mean_step == 3
    assert result.finish >= 0.03


def test_rates_and_options_are_checked() -> None:
    assert parse_rate("100mbit") == pytest.approx(12.5e6)
    assert parse_rate("1gbit") == pytest.approx(1.25e8)
    with pytest.raises(ConfigError, match="100mbit"):
        parse_rate("fast")
    with pytest.raises(ConfigError, match="Pareto"):
        ComputeTimes(heavy_tail=0.5)


def test_the_command_writes_its_table_csv_and_plot(tmp_path, capsys) -> None:
    from fast_core.cli import main as fast

    with pytest.raises(SystemExit) as ended:
        fast(["simulate", "-n", "2,4", "--steps", "10", "--strategy", "allreduce", "--strategy", "async:ring",
              "--straggler", "1:3", "--out", str(tmp_path)])
    assert ended.value.code == 0
    rows = (tmp_path / "simulate.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 and rows[0].startswith("workers,strategy,job_seconds")
    assert (tmp_path / "simulate.png").stat().st_size > 0
    assert "async:ring" in capsys.readouterr().out
    with pytest.raises(SystemExit) as ended:
        fast(["simulate", "-n", "4", "--straggler", "slow"])
    assert ended.value.code == 2
    assert "RANK:FACTOR" in capsys.readouterr().err
