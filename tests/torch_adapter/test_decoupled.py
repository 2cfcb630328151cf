"""fast_torch.DecoupledTrainer against the decoupled pipeline's rule in NumPy (tests/pipeline_reference.py): every
parameter of every stage after the whole schedule, for K x D = 1 x 4 (plain data parallelism), 2 x 2, 4 x 1 and
3 x 1 on the in-process engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mpirun import run_mpi
from pipeline_reference import LAYOUTS, check_evaluation, evaluation_between_steps, init_layers, train

import fast_torch as fast
from fast_core.engine.local import LocalCluster
from fast_torch import DecoupledTrainer
from fast_torch.pipeline_sync import SynchronousPipelineTrainer

SIZES = [6, 8, 8, 5, 4]  # four dense layers
BATCH, BATCHES, LR = 5, 7, 0.2


def _model(layers: list[list[np.ndarray]]) -> torch.nn.Sequential:
    blocks = []
    for i, (w, b) in enumerate(layers):
        linear = torch.nn.Linear(*w.shape, dtype=torch.float64)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w.T))
            linear.bias.copy_(torch.from_numpy(b))
        blocks.append(linear if i == len(layers) - 1 else torch.nn.Sequential(linear, torch.nn.Tanh()))
    return torch.nn.Sequential(*blocks)


def _data(replicas: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(3)
    return [
        [(rng.normal(size=(BATCH, SIZES[0])), rng.integers(0, SIZES[-1], BATCH)) for _ in range(BATCHES)]
        for _ in range(replicas)
    ]


def _train(engine, stages: int, bounds: list[int]) -> dict:
    layers = init_layers(SIZES)
    trainer = fast.DecoupledTrainer(
        _model(layers),
        stages,
        optimizer=lambda params: torch.optim.SGD(params, lr=LR),
        loss_fn=torch.nn.functional.cross_entropy,
        strategy="allreduce",
        split=bounds,
        engine=engine,
    )
    losses = []
    for x, y in _data(engine.size // stages)[trainer.replica]:
        loss = trainer.step(torch.from_numpy(x), torch.from_numpy(y))
        losses += [] if loss is None else [loss]
    losses += trainer.finish()
    return {"stage": trainer.stage, "replica": trainer.replica, "params": _params(trainer), "losses": losses}


def _params(trainer: fast.DecoupledTrainer) -> dict[str, np.ndarray]:
    return {name: p.detach().numpy().copy() for name, p in trainer.module.named_parameters()}


def _check(params: dict[str, np.ndarray], expected: list[list[np.ndarray]], first: int) -> None:
    """A stage's parameters against the reference's layers (the stage's first layer is ``first``)."""
    for name, value in params.items():
        block, kind = int(name.split(".")[0]), name.split(".")[-1]
        reference = expected[first + block][0].T if kind == "weight" else expected[first + block][1]
        np.testing.assert_allclose(value, reference, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize(("stages", "replicas", "bounds"), LAYOUTS)
def test_every_parameter_follows_the_delayed_gradient_rule(stages: int, replicas: int, bounds: list[int]) -> None:
    results = LocalCluster(stages * replicas, timeout=120).run(_train, stages, bounds)
    expected, losses = train(init_layers(SIZES), bounds, _data(replicas), LR)
    for result in results:
        _check(result["params"], expected, bounds[result["stage"]])
        if result["stage"] == stages - 1:
            assert len(result["losses"]) == BATCHES
    assert np.abs(expected[0][0] - init_layers(SIZES)[0][0]).max() > 1e-3  # the first stage did train


def _bad_inputs(engine) -> None:
    layers = init_layers(SIZES)
    sgd = lambda params: torch.optim.SGD(params, lr=LR)  # noqa: E731 - a one-line factory
    with pytest.raises(ValueError, match="must rise from 0 to 4 in 3 distinct boundaries"):
        fast.DecoupledTrainer(_model(layers), 2, sgd, torch.nn.functional.cross_entropy, split=[0, 4, 4], engine=engine)
    with pytest.raises(ValueError, match="does not fit|size % stages|stages"):
        fast.DecoupledTrainer(_model(layers), 3, sgd, torch.nn.functional.cross_entropy, engine=engine)
    trainer = fast.DecoupledTrainer(_model(layers), 2, sgd, torch.nn.functional.cross_entropy, engine=engine)
    if trainer.stage == 0:
        with pytest.raises(ValueError, match="stage 0 reads the data"):
            trainer.step(None, torch.zeros(BATCH, dtype=torch.int64))
    else:
        with pytest.raises(ValueError, match="the last stage computes the loss"):
            trainer.step(torch.zeros(BATCH, SIZES[0], dtype=torch.float64), None)


def test_bad_input_is_named_on_every_rank() -> None:
    LocalCluster(2, timeout=120).run(_bad_inputs)


def _evaluate(engine) -> tuple[float, float]:
    sgd = lambda params: torch.optim.SGD(params, lr=LR)  # noqa: E731 - a one-line factory
    trainer = fast.DecoupledTrainer(
        _model(init_layers(SIZES)), 2, sgd, torch.nn.functional.cross_entropy, engine=engine
    )
    return evaluation_between_steps(trainer, torch.from_numpy, SIZES, BATCH)


def test_the_pipeline_evaluates_between_steps_without_disturbing_training() -> None:
    check_evaluation(LocalCluster(2, timeout=120).run(_evaluate), SIZES)


def _synchronous(engine) -> dict:
    trainer = SynchronousPipelineTrainer(
        _model(init_layers(SIZES)),
        2,
        lambda params: torch.optim.SGD(params, lr=LR),
        torch.nn.functional.cross_entropy,
        split=[0, 2, 4],
        engine=engine,
        micro_batches=3,
    )
    for x, y in _data(1)[0]:
        trainer.step(torch.from_numpy(x), torch.from_numpy(y))
    trainer.finish()
    return {
        "stage": trainer.stage,
        "params": {n: p.detach().numpy().copy() for n, p in trainer.module.named_parameters()},
    }


def test_the_synchronous_pipeline_trains_as_one_process_does() -> None:
    expected, _ = train(init_layers(SIZES), [0, 4], _data(1), LR)  # no delay: plain SGD
    for result in LocalCluster(2, timeout=120).run(_synchronous):
        _check(result["params"], expected, 2 * result["stage"])


def _timed_split(engine) -> list[int]:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 600), torch.nn.Linear(600, 600), torch.nn.Linear(600, 8)]
    sgd = lambda params: torch.optim.SGD(params, lr=LR)  # noqa: E731 - a one-line factory
    sample = torch.randn(256, 8)
    return DecoupledTrainer(layers, 2, sgd, torch.nn.functional.mse_loss, split=sample, engine=engine).bounds


def test_a_sample_batch_splits_by_measured_time_the_same_on_every_rank() -> None:
    first, second = LocalCluster(2, timeout=120).run(_timed_split)
    assert first == second and first[0] == 0 and first[-1] == 4 and first[1] in (2, 3)  # the 600x600 layer weighs most


@pytest.mark.mpi
def test_the_benchmark_trains_decoupled_stages_on_four_mpi_ranks() -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "decoupled.py"
    small = ["--epochs", "2", "--width", "64", "--depth", "4", "--batch", "64", "--lr", "0.05", "--momentum", "0"]
    output = run_mpi(4, script, "--worker", "--layout", "2x2", *small, timeout=120)
    result = json.loads(output.strip().splitlines()[-1])
    assert result["layout"] == "2x2" and result["test_accuracy"] > 0.8, output  # MNIST, 2 epochs: 0.881 here
    assert len(result["curve"]) == 2 and result["curve"][1][1] > result["curve"][0][1]


def _windowed(engine, window: int) -> dict:
    trainer = DecoupledTrainer(
        _model(init_layers(SIZES)),
        3,
        lambda params: torch.optim.SGD(params, lr=LR),
        torch.nn.functional.cross_entropy,
        split=[0, 1, 3, 4],
        window=window,
        engine=engine,
    )
    for x, y in _data(1)[0]:
        trainer.step(torch.from_numpy(x), torch.from_numpy(y))
    trainer.finish()
    return {"stage": trainer.stage, "params": _params(trainer)}


@pytest.mark.parametrize("window", [1, 2, 3])
def test_a_window_bounds_the_delay_and_window_one_is_plain_training(window: int) -> None:
    bounds = [0, 1, 3, 4]
    expected, _ = train(init_layers(SIZES), bounds, _data(1), LR, window=window)
    if window == 1:  # no batch overtakes another: the gradient of plain SGD
        plain, _ = train(init_layers(SIZES), [0, 4], _data(1), LR)
        for mine, reference in zip(expected, plain, strict=True):
            np.testing.assert_allclose(mine[0], reference[0], rtol=1e-12, atol=1e-14)
    for result in LocalCluster(3, timeout=120).run(_windowed, window):
        _check(result["params"], expected, bounds[result["stage"]])
