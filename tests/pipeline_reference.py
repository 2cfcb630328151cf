"""The fully decoupled pipeline's rule in NumPy, one process: the reference the trainers are tested against.

A chain of dense layers, ``tanh`` after each but the last, softmax cross-entropy at the end; layers grouped into
stages by boundaries; D replicas of every stage, each its own batches, a stage's gradient averaged over its
replicas (all-reduce) before plain SGD. At each tick every stage forwards and backpropagates the batches
``fast_core.pipeline.schedule.Schedule`` names, messages sent at tick t read at tick t + 1, each backward pass
through the weights its forward pass used (kept per batch), the update applied to the current weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fast_core.pipeline.schedule import Schedule

Layer = list[np.ndarray]  # [weight (in, out), bias (out,)]

LAYOUTS = [(1, 4, [0, 4]), (2, 2, [0, 2, 4]), (4, 1, [0, 1, 2, 3, 4]), (3, 1, [0, 1, 3, 4])]
"""(stages K, replicas D, layer boundaries) every trainer is checked on: K = 1 is plain data parallelism."""


def init_layers(sizes: Sequence[int], seed: int = 0) -> list[Layer]:
    rng = np.random.default_rng(seed)
    return [
        [rng.normal(0.0, 1.0 / np.sqrt(n_in), (n_in, n_out)), rng.normal(0.0, 0.1, n_out)]
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False)
    ]


def stage_forward(layers: list[Layer], x: np.ndarray, last: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """The stage's output and the input of each of its layers (for the backward pass)."""
    inputs = []
    for i, (w, b) in enumerate(layers):
        inputs.append(x)
        x = x @ w + b
        if not (last and i == len(layers) - 1):
            x = np.tanh(x)
    return x, inputs


def stage_backward(
    layers: list[Layer], inputs: list[np.ndarray], grad: np.ndarray, last: bool
) -> tuple[list[Layer], np.ndarray]:
    """Gradients of each layer's weight and bias, and of the stage's input, given that of its output."""
    grads: list[Layer] = []
    for i in range(len(layers) - 1, -1, -1):
        w, b = layers[i]
        if not (last and i == len(layers) - 1):
            grad = grad * (1.0 - np.tanh(inputs[i] @ w + b) ** 2)
        grads.insert(0, [inputs[i].T @ grad, grad.sum(axis=0)])
        grad = grad @ w.T
    return grads, grad


def cross_entropy_grad(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy of the batch and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[np.arange(len(y)), y]).mean())
    p[np.arange(len(y)), y] -= 1.0
    return loss, p / len(y)


def train(
    layers: list[Layer],
    bounds: Sequence[int],
    batches: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]],
    lr: float,
    window: int | None = None,
) -> tuple[list[Layer], list[float]]:
    """Train ``layers`` (copied) split at ``bounds`` on ``batches[replica][i]`` with the decoupled rule; returns
    the layers and the last stage's loss of each batch (averaged over replicas)."""
    stages = len(bounds) - 1
    replicas = len(batches)
    count = len(batches[0])
    layers = [[a.copy() for a in layer] for layer in layers]
    own = [list(range(bounds[k], bounds[k + 1])) for k in range(stages)]
    schedule = Schedule(stages, count, window)
    forwarded: dict[tuple[int, int], np.ndarray] = {}  # (stage receiving, batch) -> [replicas] activations
    returned: dict[tuple[int, int], np.ndarray] = {}  # (stage receiving, batch) -> [replicas] gradients
    stash: dict[tuple[int, int], list] = {}
    losses: list[float] = []
    for tick in range(schedule.ticks):
        sent_forward, sent_back = {}, {}
        updates = []
        for k in range(stages):
            last = k == stages - 1
            batch = schedule.forward_batch(k, tick)
            if batch is not None:
                weights = [[a.copy() for a in layers[i]] for i in own[k]]
                kept = []
                arrived = None if k == 0 else forwarded.pop((k, batch))
                for r in range(replicas):
                    x = batches[r][batch][0] if k == 0 else arrived[r]
                    out, inputs = stage_forward(weights, x, last)
                    kept.append((inputs, out))
                stash[(k, batch)] = [weights, kept]
                if not last:
                    sent_forward[(k + 1, batch)] = [out for _, out in kept]
            batch = schedule.backward_batch(k, tick)
            if batch is None:
                continue
            weights, kept = stash.pop((k, batch))
            received = None if last else returned.pop((k, batch))
            grads, back, batch_losses = None, [], []
            for r, (inputs, out) in enumerate(kept):
                if last:
                    loss, g = cross_entropy_grad(out, batches[r][batch][1])
                    batch_losses.append(loss)
                else:
                    g = received[r]
                g_layers, g_in = stage_backward(weights, inputs, g, last)
                back.append(g_in)
                grads = (
                    g_layers
                    if grads is None
                    else [[a + c for a, c in zip(x, z, strict=True)] for x, z in zip(grads, g_layers, strict=True)]
                )
            if batch_losses:
                losses.append(float(np.mean(batch_losses)))
            if k > 0:
                sent_back[(k - 1, batch)] = back
            updates.append((k, [[a / replicas for a in layer] for layer in grads]))
        for k, grads in updates:
            for i, g in zip(own[k], grads, strict=True):
                layers[i][0] -= lr * g[0]
                layers[i][1] -= lr * g[1]
        forwarded.update(sent_forward)
        returned.update(sent_back)
    return layers, losses


def evaluation_between_steps(trainer, convert, sizes: Sequence[int], batch: int) -> tuple[float, float]:
    """A trainer's ``evaluate`` with a batch in flight, then after ``finish`` (every framework's test runs this):
    23 seeded examples, ``convert`` turning NumPy arrays into the framework's inputs."""
    rng = np.random.default_rng(5)
    x, y = convert(rng.normal(size=(23, sizes[0]))), convert(rng.integers(0, sizes[-1], 23))
    trainer.step(x[:batch], y[:batch])  # a batch in flight in the training pipeline
    accuracy = trainer.evaluate(x, y, batch_size=10)
    trainer.step(x[batch : 2 * batch], y[batch : 2 * batch])
    trainer.finish()
    return accuracy, trainer.evaluate(x, y, batch_size=7)


def check_evaluation(results: list[tuple[float, float]], sizes: Sequence[int]) -> None:
    """Every rank saw the start model's accuracy before any update, and the same accuracy after ``finish``."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(23, sizes[0])), rng.integers(0, sizes[-1], 23)
    logits, _ = stage_forward(init_layers(sizes), x, last=True)
    first = [r[0] for r in results]
    assert all(a == first[0] for a in first) and abs(first[0] - np.mean(logits.argmax(1) == y)) < 1e-9, results
    assert all(r[1] == results[0][1] for r in results), results
