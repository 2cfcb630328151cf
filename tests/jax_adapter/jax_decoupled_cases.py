"""fast_jax.DecoupledTrainer's cases, shared by tests/jax_adapter/test_jax_decoupled.py (in-process ranks) and a
real mpiexec launch:

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m mpi4py tests/jax_adapter/jax_decoupled_cases.py

trains a 2 x 2 grid under all-reduce and under D-PSGD on real processes and checks every parameter against the
NumPy references (tests/pipeline_reference.py, tests/pipeline_dpsgd_reference.py); rank 0 prints one line per
case, a failed check makes the job exit nonzero. The JAX layers are float32, the references float64: compared to
float32's accuracy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the NumPy references
from pipeline_dpsgd_reference import train_dpsgd  # noqa: E402
from pipeline_reference import init_layers, train  # noqa: E402

import fast_jax as fast  # noqa: E402
from fast_core import Engine  # noqa: E402

SIZES = [6, 8, 8, 5, 4]  # four dense layers
BATCH, BATCHES, LR = 5, 7, 0.2
RTOL, ATOL = 2e-4, 2e-5  # float32 against float64


def hidden(p: dict, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ p["w"] + p["b"])


def linear(p: dict, x: jax.Array) -> jax.Array:
    return x @ p["w"] + p["b"]


def jax_layers(layers: list[list[np.ndarray]]) -> list[tuple]:
    """The reference's layers as (apply_fn, params) in float32: tanh after each but the last."""
    params = [{"w": jnp.asarray(w, jnp.float32), "b": jnp.asarray(b, jnp.float32)} for w, b in layers]
    return [(linear if i == len(layers) - 1 else hidden, p) for i, p in enumerate(params)]


def loss(logits: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def data(replicas: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(3)
    return [
        [(rng.normal(size=(BATCH, SIZES[0])), rng.integers(0, SIZES[-1], BATCH)) for _ in range(BATCHES)]
        for _ in range(replicas)
    ]


def train_stage(
    engine: Engine, stages: int, bounds: list[int], strategy: str = "allreduce", window: int | None = None
) -> dict:
    """This rank's stage trained on its replica's batches: its stage, replica, params (float64) and losses."""
    trainer = fast.DecoupledTrainer(
        jax_layers(init_layers(SIZES)),
        stages,
        optimizer=optax.sgd(LR),
        loss_fn=loss,
        strategy=strategy,
        split=bounds,
        window=window,
        engine=engine,
    )
    losses = []
    for x, y in data(engine.size // stages)[trainer.replica]:
        finished = trainer.step(x.astype(np.float32), y)
        losses += [] if finished is None else [finished]
    losses += trainer.finish()
    params = [{k: np.asarray(v, np.float64) for k, v in p.items()} for p in trainer.params]
    return {"stage": trainer.stage, "replica": trainer.replica, "params": params, "losses": losses}


def check_stage(params: list[dict], expected: list[list[np.ndarray]], first: int) -> None:
    """A stage's parameters against the reference's layers (the stage's first layer is ``first``)."""
    for i, layer in enumerate(params):
        for kind, index in (("w", 0), ("b", 1)):
            np.testing.assert_allclose(
                layer[kind], expected[first + i][index], rtol=RTOL, atol=ATOL, err_msg=f"layer {first + i} {kind}"
            )


def expected_layers(strategy: str, bounds: list[int], replicas: int) -> list[list[list[np.ndarray]]]:
    """The reference's layers of every replica (``[replica][layer]``) under ``strategy``."""
    if strategy == "allreduce":
        return [train(init_layers(SIZES), bounds, data(replicas), LR)[0]] * replicas
    if strategy == "dpsgd:ring":
        return train_dpsgd(init_layers(SIZES), bounds, data(replicas), LR, "ring")
    raise ValueError(f"no reference for strategy {strategy!r}")


if __name__ == "__main__":
    engine = fast.init(timeout=60)
    bounds = [0, 2, 4]
    for strategy in ("allreduce", "dpsgd:ring"):
        result = train_stage(engine, 2, bounds, strategy)
        check_stage(result["params"], expected_layers(strategy, bounds, 2)[result["replica"]], bounds[result["stage"]])
        engine.barrier()
        if engine.rank == 0:
            print(f"2x2 {strategy}: every parameter of every stage matches the reference", flush=True)
