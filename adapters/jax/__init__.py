"""fast_jax: run any fast_core strategy around a JAX training step, as a function transform.

import fast_jax as fast
fast.init()
step = fast.distributed(jax.jit(train_step), strategy="dpsgd:ring")  # train_step(params, opt_state, batch)
step = fast.distributed(jax.jit(grad_step), "allreduce", optimizer=opt)  # grad_step(params, batch), for gradients
params, opt_state, metrics = step(params, opt_state, batch)
step = fast.distributed(train_step, "dpsgd:ring")  # train_step(state, batch) -> (state, metrics): a Flax TrainState
state, metrics = step(state, batch)
params = fast.average(params, step=step)  # fast.sum(tree) too, e.g. counts
fast.save_checkpoint("ckpt.npz", step, params, opt_state)  # collective; load_checkpoint resumes on any size
trainer = fast.DecoupledTrainer(layers, stages=2, optimizer=optax.sgd(0.1), loss_fn=loss)  # decoupled pipeline stages
"""

from __future__ import annotations

try:
    import optax  # noqa: F401

    import jax  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError("fast_jax needs JAX and optax: pip install 'fast-training[jax]'") from exc

from fast_core.runtime.process import init, rank, size

from .api import broadcast, shard, sum  # noqa: A004 - Horovod's and torch.distributed's name
from .checkpoint import load_checkpoint, save_checkpoint
from .decoupled import DecoupledTrainer
from .flat import FlatTree
from .model import JaxModel
from .state import DistributedStateStep
from .step import DistributedStep, average
from .wrap import distributed

__all__ = [
    "DecoupledTrainer",
    "DistributedStateStep",
    "DistributedStep",
    "FlatTree",
    "JaxModel",
    "average",
    "broadcast",
    "distributed",
    "init",
    "load_checkpoint",
    "rank",
    "save_checkpoint",
    "shard",
    "size",
    "sum",
]
