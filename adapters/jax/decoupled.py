"""Data parallelism with fully decoupled parallel backpropagation in JAX: a list of ``(apply_fn, params)`` layers
split into K stages on K ranks, each stage replicated D times (K x D ranks), no stage waiting for another's forward
or backward pass. The counterpart of ``fast_torch.DecoupledTrainer``, on the same schedule.

Each tick every stage forwards the newest activation from the stage before and backpropagates the error gradient
the stage after sent for an earlier batch (``fast_core.pipeline.schedule``: stage k's gradient is 2 (K - 1 - k)
ticks old, computed at the weights it forwarded that batch with), then takes a step of the user's optax optimizer.
Its D replicas (same stage, different data) mix through any FAST strategy over their own group of ranks: all-reduce
by default, D-PSGD, asynchronous averaging... With K = 1 it is plain data parallelism.

JAX arrays are immutable, so keeping the weights of a batch's forward pass costs nothing: the ``jax.vjp`` pullback
kept per batch in flight holds them (PipeDream's weight stashing for free), and the backward pass is that pullback
applied to the error gradient.

    layers = [(lambda p, x: jnp.tanh(x @ p["w"] + p["b"]), p1), ..., (lambda p, x: x @ p["w"] + p["b"], pn)]
    trainer = fast_jax.DecoupledTrainer(layers, stages=2, optimizer=optax.sgd(0.1), loss_fn=cross_entropy)
    for x, y in loader:              # the same batches on the ranks of one replica: its shard of the data
        trainer.step(x, y)           # stage 0 reads x, the last stage y; returns the loss the last stage finished
    trainer.finish()                 # drain the batches still in flight
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import optax

import jax
import jax.numpy as jnp
from fast_core import Engine, Strategy
from fast_core.pipeline.partition import balanced_split
from fast_core.pipeline.stage import DecoupledStage, split_bounds
from fast_core.runtime.process import init as default_engine
from fast_core.strategies.spec import resolve_strategy

from .step import DistributedStep

ApplyFn = Callable[[Any, jax.Array], jax.Array]
Layer = tuple[ApplyFn, Any]


class DecoupledTrainer(DecoupledStage):
    """This rank's stage of a K x D grid: its layers' functions and params, optax state, channels to the
    neighbouring stages, and its replicas' FAST strategy (the schedule: ``fast_core.pipeline.stage``).

    ``layers``: ``(apply_fn, params)`` pairs, ``apply_fn(params, x) -> y`` (params any pytree of float arrays).
    ``window``: at most that many batches in flight, which bounds each stage's gradient to ``window - 1`` updates
    old (``fast_core.pipeline.schedule``); None runs the full pipeline. ``split``: "parameters" balances the
    stages' parameter counts, a sample batch (an array) their forward and backward time measured on it (rank 0's
    measurement for all), or give the K + 1 layer boundaries. Every rank builds the whole model the same way (the
    same seed) and keeps its stage's layers; a stage's replicas start from their group's rank 0. ``strategy``: the
    replicas' (None: ``fast run --strategy``'s, else all-reduce), run as ``fast_jax.distributed``'s gradient form
    runs it (``replicas`` is that DistributedStep: ``replicas.worker`` has the metrics). ``params`` and
    ``opt_state`` are the stage's current ones (``params``: the list of its layers' params).
    """

    def __init__(
        self,
        layers: Sequence[Layer],
        stages: int,
        optimizer: optax.GradientTransformation,
        loss_fn: Callable[[jax.Array, jax.Array], jax.Array],
        strategy: Strategy | str | None = None,
        *,
        split: str | Sequence[int] | np.ndarray | jax.Array = "parameters",
        window: int | None = None,
        engine: Engine | None = None,
    ) -> None:
        layers = _check_layers(layers)
        if not isinstance(optimizer, optax.GradientTransformation):
            raise TypeError(
                f"optimizer must be an optax GradientTransformation (e.g. optax.sgd(0.1)), got "
                f"{type(optimizer).__name__}: each stage keeps one optax state for its layers"
            )
        super().__init__(engine or default_engine(), stages, window)
        bounds = self._agree(_bounds(layers, stages, split))
        own = layers[bounds[self.stage] : bounds[self.stage + 1]]
        self.apply_fns = tuple(fn for fn, _ in own)
        params = [p for _, p in own]
        if not jax.tree_util.tree_leaves(params):
            raise ValueError(
                f"stage {self.stage} (layers {bounds[self.stage]}..{bounds[self.stage + 1]}) "
                "has no trainable parameter: give other split boundaries"
            )
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        # the replicas' strategy and the optax update, as fast_jax's gradient form runs them: the kept pullback
        # gives the gradient, the Worker's hooks average (all-reduce) or mix (D-PSGD) around the update
        self.replicas = DistributedStep(
            _given_gradient, resolve_strategy(strategy), optimizer, self._join_replicas(), None, None
        )
        self.params, self.opt_state = self.replicas.start(params, optimizer.init(params))
        self._apply = jax.jit(partial(_apply_stage, self.apply_fns))
        self._loss_and_error = jax.jit(jax.value_and_grad(loss_fn))
        self._stash: deque[tuple[int, jax.Array, Callable]] = deque()
        """(batch, output, the pullback of the forward pass, holding its input and weights) of each batch in flight"""

    def _close_replicas(self) -> None:
        self.replicas.close()

    def _predict(self, inputs: Any) -> np.ndarray:
        return np.asarray(self._apply(self.params, inputs))

    def _forward(self, batch: int, x: Any) -> None:
        if self.stage == 0:  # the data needs no gradient (and may be integers, e.g. token ids)
            output, pullback = jax.vjp(lambda params: self._apply(params, x), self.params)
        else:
            inputs = jnp.asarray(self._from_previous.recv(batch))
            output, pullback = jax.vjp(self._apply, self.params, inputs)  # holds this tick's weights
        self._stash.append((batch, output, pullback))
        if self._to_next is not None:
            self._to_next.send(np.asarray(output), batch)

    def _backward(self, batch: int) -> float | None:
        stashed, output, pullback = self._stash.popleft()
        assert stashed == batch, f"stage {self.stage} backpropagates batch {batch} but its oldest stash is {stashed}"
        loss = None
        if self.last:
            value, error = self._loss_and_error(output, self._labels_of(batch))
            loss = float(value)
        else:
            error = jnp.asarray(self._from_next.recv(batch))
        grads, *inputs_grad = pullback(error)
        if self._to_previous is not None:
            self._to_previous.send(np.asarray(inputs_grad[0]), batch)
        # the replicas' strategy runs around the optax update
        self.params, self.opt_state, _ = self.replicas(self.params, self.opt_state, grads)
        return loss


def _apply_stage(apply_fns: tuple[ApplyFn, ...], params: list[Any], x: jax.Array) -> jax.Array:
    """The stage's layers in order."""
    for fn, p in zip(apply_fns, params, strict=True):
        x = fn(p, x)
    return x


def _given_gradient(params: Any, grads: Any) -> tuple[Any, None]:
    """The gradient form's step with the gradient already computed (by the kept pullback): it is the 'batch'."""
    return grads, None


def _check_layers(layers: Sequence[Layer]) -> list[Layer]:
    layers = list(layers)
    for i, layer in enumerate(layers):
        if not (isinstance(layer, tuple | list) and len(layer) == 2 and callable(layer[0])):
            raise TypeError(
                f"layer {i} is {type(layer).__name__}: give each layer as a pair (apply_fn, params) with "
                "apply_fn(params, x) -> y"
            )
    return layers


def _bounds(layers: list[Layer], stages: int, split: str | Sequence[int] | np.ndarray | jax.Array) -> list[int]:
    if isinstance(split, np.ndarray | jax.Array):
        return balanced_split(_layer_seconds(layers, split), stages)
    costs = [sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)) for _, params in layers]
    return split_bounds(split, costs, stages)


def _layer_seconds(layers: list[Layer], sample: Any, repeats: int = 5) -> list[float]:
    """Each layer's forward and backward time on ``sample`` passed through the layers before it (median, after a
    first call that compiles)."""
    seconds = []
    inputs = jnp.asarray(sample)
    for fn, params in layers:
        timed = jax.jit(partial(_forward_backward, fn, jnp.issubdtype(inputs.dtype, jnp.floating)))
        jax.block_until_ready(timed(params, inputs))
        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            jax.block_until_ready(timed(params, inputs))
            times.append(time.perf_counter() - begin)
        seconds.append(sorted(times)[repeats // 2])
        inputs = fn(params, inputs)
    return seconds


def _forward_backward(fn: ApplyFn, floating: bool, params: Any, x: jax.Array) -> Any:
    """One layer's forward pass and its backward pass with the output as error (the input's gradient only when it
    is floating: integer inputs, e.g. token ids, have none)."""
    if floating:
        output, pullback = jax.vjp(fn, params, x)
    else:
        output, pullback = jax.vjp(lambda p: fn(p, x), params)
    return pullback(output)
