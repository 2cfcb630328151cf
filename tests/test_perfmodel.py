"""fast model: the step-time formulas against numbers computed by hand, the machine file, the command."""

from __future__ import annotations

import json
import math

import pytest

from fast_core.cli import main as fast
from fast_core.errors import ConfigError
from fast_core.perfmodel import Machine, dense, parse_layers, predict, step_compute_seconds

# 1 Gflop/s, 1 GB/s memory, 1 MB/s links with 1 ms latency, 4-byte parameters, one core per rank
MACHINE = Machine(peak_flops=1e9, memory_bandwidth=1e9, latency=1e-3, bandwidth=1e6, step_overhead=1e-4,
                  cores=64, dtype_bytes=4)
LAYERS = [dense(100, 10)]  # 1,010 parameters: S = 4,040 bytes; 2,000 flops per sample


def test_compute_is_a_roofline_plus_backward_update_and_overhead() -> None:
    # batch 10: 20,000 flops over 4 x (10 x 110 + 1010) bytes: intensity 2.37 flop/B -> memory bound at 2.37 Gflop/s
    forward = 20_000 / min(1e9, 1e9 * 20_000 / (4 * (10 * 110 + 1010)))
    expected = 3 * forward + 3 * 1010 * 4 / 1e9 + 1e-4
    assert step_compute_seconds(LAYERS, 10, MACHINE) == pytest.approx(expected)
    per_byte = Machine(**{**MACHINE.__dict__, "step_overhead_per_byte": 1e-9})  # + 1 ns per parameter byte
    assert step_compute_seconds(LAYERS, 10, per_byte, slowdown=2.0) == pytest.approx(
        2 * (expected - 1e-4) + 1e-4 + 4040e-9
    )


@pytest.mark.parametrize(
    ("strategy", "communication", "waits"),
    [
        ("allreduce", 2 * 3 * 1e-3 + 2 * 7 / 8 * 4040 / 1e6, True),  # halving on 8 ranks: 2 log2 8 latencies
        ("ps:servers=2", 2 * (1e-3 + 4 * 4040 / 1e6), True),  # a server's link: 8/2 shares of S each way
        ("localsgd:period=4", (2 * 3 * 1e-3 + 2 * 7 / 8 * 4040 / 1e6) / 4, True),
        ("gossip", 1e-3 + 4040 / 1e6, True),
        ("easgd", 2 * (1e-3 + 7 * 4040 / 1e6) / 4, True),  # tau 4: the centre's link takes 7 models in and out
    ],
)
def test_strategies_that_wait_add_their_communication(strategy: str, communication: float, waits: bool) -> None:
    compute = step_compute_seconds(LAYERS, 10, MACHINE)
    guess = predict(strategy, LAYERS, 10, 8, MACHINE)
    assert guess.communication == pytest.approx(communication)
    assert guess.step == pytest.approx(compute + communication)


def test_dpsgd_overlaps_its_exchange_and_async_never_waits() -> None:
    compute = step_compute_seconds(LAYERS, 10, MACHINE)
    mixing = 4 * 4040 / 1e9  # ring: 2 neighbours, (2 + 2) S through memory
    dpsgd = predict("dpsgd:ring", LAYERS, 10, 8, MACHINE)
    assert dpsgd.communication == pytest.approx(1e-3 + 2 * 4040 / 1e6)
    assert dpsgd.step == pytest.approx(max(compute, dpsgd.communication) + mixing)
    assert predict("async:ring", LAYERS, 10, 8, MACHINE).step == pytest.approx(compute + mixing)
    torus = predict("dpsgd:torus", LAYERS, 10, 16, MACHINE)  # 4 neighbours on a 4x4 torus
    assert torus.communication == pytest.approx(1e-3 + 4 * 4040 / 1e6)


def test_ranks_sharing_cores_compute_slower() -> None:
    shared = Machine(**{**MACHINE.__dict__, "cores": 2})
    alone = predict("allreduce", LAYERS, 10, 4, MACHINE).compute - 1e-4  # the overhead is measured shared already
    assert predict("allreduce", LAYERS, 10, 4, shared).compute == pytest.approx(2 * alone + 1e-4)
    assert predict("allreduce", LAYERS, 10, 4, shared, ranks_per_machine=1).compute == pytest.approx(alone + 1e-4)


def test_layers_and_strategies_are_checked() -> None:
    assert [layer.params for layer in parse_layers("dense:64x128,conv2d:1x8x3@28x28")] == [64 * 128 + 128, 8 * 9 + 8]
    assert parse_layers("conv2d:1x8x3@28x28")[0].flops == 2 * 9 * 8 * 28 * 28
    with pytest.raises(ConfigError, match="dense:INxOUT"):
        parse_layers("dense:64")
    with pytest.raises(ConfigError, match="no model of 'sgp'"):
        predict("sgp", LAYERS, 10, 8, MACHINE)


def test_the_command_prints_every_strategy_and_the_fastest(tmp_path, capsys) -> None:
    machine = tmp_path / "machine.json"
    MACHINE.save(machine)
    assert Machine.load(machine) == MACHINE
    with pytest.raises(SystemExit) as ended:
        fast(["model", "--layers", "dense:100x10", "-n", "8", "--batch", "10", "--machine", str(machine),
              "--strategies", "allreduce,dpsgd:ring,ps:servers=2", "--sweep", str(tmp_path / "sweep.png")])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    for strategy in ("allreduce", "dpsgd:ring", "ps:servers=2"):
        assert strategy in out
    assert "fastest: dpsgd:ring" in out  # overlapped: max(compute, comm) < compute + comm of the others
    assert (tmp_path / "sweep.png").stat().st_size > 0
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * (7 + 6 + 6 + 6 + 8)


def test_a_bad_machine_file_names_the_fix(tmp_path) -> None:
    bad = tmp_path / "machine.json"
    bad.write_text(json.dumps({"peak": 1}))
    with pytest.raises(ConfigError, match="unknown fields"):
        Machine.load(bad)
    assert math.isfinite(Machine().slowdown(4))


def test_calibration_measures_positive_figures_in_process() -> None:
    from fast_core.engine.local import LocalCluster
    from fast_core.perfmodel.calibrate import _links_from, _measure, copy_rate, gemm_rate

    latency, bandwidth, overhead, per_byte = _links_from(LocalCluster(2, timeout=30).run(_measure)[0])
    assert 0 < latency < 0.1 and bandwidth > 1e6 and 0 < overhead < 0.1 and 0 <= per_byte < 1e-6
    assert gemm_rate(64) > 1e6 and copy_rate(1 << 20) > 1e6


def test_pipeline_layouts_against_hand_numbers() -> None:
    from fast_core.perfmodel.pipeline import StageTerms, decoupled_tick, gpipe_step, pipeline_terms, split_by_flops

    stage = StageTerms(compute=4.0, allreduce=1.0, message=0.5, update=0.25)
    assert decoupled_tick(stage) == 4.0 + 1.0 + 2 * 0.5 + 0.25
    assert gpipe_step(stage, stages=4, micro_batches=4) == 7 * (4.0 + 1.0) / 4 + 1.0 + 0.25
    layers = [dense(10, 10)] * 3 + [dense(10, 40)]
    assert [len(part) for part in split_by_flops(layers, 2)] == [3, 1]  # 600 flops against 800
    terms = pipeline_terms(layers, 8, 4, 2, MACHINE)  # the slowest stage: the 10x40 layer, 2 replicas
    assert terms.allreduce == pytest.approx(2 * 1e-3 + 2 * 1 / 2 * 440 * 4 / 1e6)
    assert terms.message == pytest.approx(1e-3 + 8 * 40 * 4 / 1e6)
    assert terms.update == pytest.approx(3 * 440 * 4 / 1e9)


def test_a_measured_sharing_slowdown_replaces_ranks_over_cores() -> None:
    shared = Machine(**{**MACHINE.__dict__, "cores": 2, "sharing": {"4": 3.7}})
    assert shared.slowdown(4) == 3.7 and shared.slowdown(8) == 4.0
    alone = predict("allreduce", LAYERS, 10, 4, MACHINE).compute - 1e-4
    assert predict("allreduce", LAYERS, 10, 4, shared).compute == pytest.approx(3.7 * alone + 1e-4)


def test_strategies_answer_the_models_questions_themselves() -> None:
    from fast_core.strategies import make_strategy
    from fast_core.strategies.cost import CostProfile

    assert make_strategy("ps:servers=2").cost_profile(8) == CostProfile(rounds=2, models_per_round=4.0)
    assert make_strategy("easgd:tau=3").cost_profile(8) == CostProfile(rounds=2, models_per_round=7, period=3)
    assert make_strategy("localsgd:period=8").cost_profile(8) == CostProfile(allreduce=True, period=8)
    ring = CostProfile(rounds=1, models_per_round=2, timing="overlaps", mixing_copies=4)
    assert make_strategy("dpsgd:ring").cost_profile(8) == ring
    assert make_strategy("dpsgd:ring,warmup=5").cost_profile(8) == ring  # priced by the phase that runs to the end
    assert make_strategy("sgp").cost_profile(8) is None


def test_every_spreads_an_exchange_over_its_steps() -> None:
    compute = step_compute_seconds(LAYERS, 10, MACHINE)
    every = predict("dpsgd:ring,every=4", LAYERS, 10, 8, MACHINE)
    assert every.communication == pytest.approx((1e-3 + 2 * 4040 / 1e6) / 4)
    assert every.step == pytest.approx(max(compute, every.communication) + 4 * 4040 / 1e9 / 4)
    assert predict("localsgd:period=2,every=2", LAYERS, 10, 8, MACHINE).communication == pytest.approx(
        predict("localsgd:period=4", LAYERS, 10, 8, MACHINE).communication
    )
