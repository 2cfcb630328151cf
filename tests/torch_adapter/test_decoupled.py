"""fast_torch.DecoupledTrainer against the decoupled pipeline's rule in NumPy (tests/pipeline_reference.py): every
parameter of every stage after the whole schedule, for K x D = 1 x 4 (plain data parallelism), 2 x 2, 4 x 1 and
3 x 1 on the in-process engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pipeline_reference import init_layers, train

import fast_torch as fast
from fast_core.engine.local import LocalCluster

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
    params = {name: p.detach().numpy().copy() for name, p in trainer.module.named_parameters()}
    return {"stage": trainer.stage, "replica": trainer.replica, "params": params, "losses": losses}


@pytest.mark.parametrize(
    ("stages", "replicas", "bounds"), [(1, 4, [0, 4]), (2, 2, [0, 2, 4]), (4, 1, [0, 1, 2, 3, 4]), (3, 1, [0, 1, 3, 4])]
)
def test_every_parameter_follows_the_delayed_gradient_rule(stages: int, replicas: int, bounds: list[int]) -> None:
    results = LocalCluster(stages * replicas, timeout=30).run(_train, stages, bounds)
    expected, losses = train(init_layers(SIZES), bounds, _data(replicas), LR)
    for result in results:
        first = bounds[result["stage"]]
        for name, value in result["params"].items():
            block, kind = int(name.split(".")[0]), name.split(".")[-1]
            reference = expected[first + block][0].T if kind == "weight" else expected[first + block][1]
            np.testing.assert_allclose(value, reference, rtol=1e-10, atol=1e-12, err_msg=f"{result} {name}")
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
    LocalCluster(2, timeout=30).run(_bad_inputs)
