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
from fast_core.pipeline import Channel, Grid, PipelineTag, replica_group
from fast_core.pipeline.partition import balanced_split
from fast_core.pipeline.schedule import Schedule
from fast_core.runtime import init as default_engine
from fast_core.strategies.spec import resolve_strategy

from .step import DistributedStep

ApplyFn = Callable[[Any, jax.Array], jax.Array]
Layer = tuple[ApplyFn, Any]


class DecoupledTrainer:
    """This rank's stage of a K x D grid: its layers' functions and params, optax state, channels to the
    neighbouring stages, and its replicas' FAST strategy.

    ``layers``: ``(apply_fn, params)`` pairs, ``apply_fn(params, x) -> y`` (params any pytree of float arrays).
    ``window``: at most that many batches in flight, which bounds each stage's gradient to ``window - 1`` updates
    old (``fast_core.pipeline.schedule``); None runs the full pipeline. ``split``: "parameters" balances the
    stages' parameter counts, a sample batch (an array) their forward and backward time measured on it (rank 0's
    measurement for all), or give the K + 1 layer boundaries. Every rank builds the whole model the same way (the
    same seed) and keeps its stage's layers; a stage's replicas start from their group's rank 0. ``params`` and
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
        engine = engine or default_engine()
        self.engine = engine
        self.grid = grid = Grid(engine.size, stages)
        self.stage, self.replica = grid.stage(engine.rank), grid.replica(engine.rank)
        bounds = np.array(_bounds(layers, stages, split), dtype=np.int64)
        engine.broadcast(bounds, 0)  # measured times differ between ranks: rank 0's split for all
        self.bounds = [int(b) for b in bounds]
        own = layers[self.bounds[self.stage] : self.bounds[self.stage + 1]]
        self.apply_fns = tuple(fn for fn, _ in own)
        params = [p for _, p in own]
        if not jax.tree_util.tree_leaves(params):
            raise ValueError(
                f"stage {self.stage} (layers {self.bounds[self.stage]}..{self.bounds[self.stage + 1]}) "
                "has no trainable parameter: give other split boundaries"
            )
        self.loss_fn = loss_fn
        self.schedule = Schedule(stages, window=window)
        self.last = self.stage == stages - 1
        self.group = replica_group(engine, grid)
        self.optimizer = optimizer
        # the replicas' strategy and the optax update, as fast_jax's gradient form runs them: the kept pullback
        # gives the gradient, the Worker's hooks average (all-reduce) or mix (D-PSGD) around the update
        self.replicas = DistributedStep(_given_gradient, resolve_strategy(strategy), optimizer, self.group, None, None)
        self.params, self.opt_state = self.replicas.start(params, optimizer.init(params))
        self._apply = jax.jit(partial(_apply_stage, self.apply_fns))
        self._loss_and_error = jax.jit(jax.value_and_grad(loss_fn))
        previous, following = grid.previous(engine.rank), grid.next(engine.rank)
        self._from_previous = Channel(engine, previous, PipelineTag.ACTIVATIONS) if previous is not None else None
        self._to_next = Channel(engine, following, PipelineTag.ACTIVATIONS) if following is not None else None
        self._from_next = Channel(engine, following, PipelineTag.ERRORS) if following is not None else None
        self._to_previous = Channel(engine, previous, PipelineTag.ERRORS) if previous is not None else None
        self._stash: deque[tuple[int, jax.Array, Callable]] = deque()
        """(batch, output, the pullback of the forward pass, holding its input and weights) of each batch in flight"""
        self._labels: deque[tuple[int, Any]] = deque()
        self.tick = 0
        self.batches = 0  # batches fed so far

    def step(self, x: Any = None, y: Any = None) -> float | None:
        """One tick with the next batch (``x`` used by stage 0, ``y`` by the last stage; others may pass None).
        Returns the loss of the last batch the last stage backpropagated in the ticks this call ran, else None."""
        if self.stage == 0 and x is None:
            raise ValueError("stage 0 reads the data: pass the batch's inputs x to step()")
        if self.last and y is None:
            raise ValueError("the last stage computes the loss: pass the batch's targets y to step()")
        if self.last:
            self._labels.append((self.batches, y))
        feed = self.schedule.feed_tick(self.batches)
        self.batches += 1
        loss = None
        while self.tick <= feed:  # under a window, ticks where stage 0 waits for its batches to come back first
            finished = self._tick(x if self.tick == feed else None)
            loss = finished if finished is not None else loss
        return loss

    def finish(self) -> list[float]:
        """Run the ticks that backpropagate the batches still in flight (no new batch); the losses they give."""
        losses = []
        fed = Schedule(self.schedule.stages, self.batches, self.schedule.window)
        while self.tick < fed.ticks:
            loss = self._tick(None, fed)
            if loss is not None:
                losses.append(loss)
        self.close()
        return losses

    def close(self) -> None:
        """Close the replicas' worker and the channels, and release the replica group's engine (collective;
        ``finish`` calls it). ``evaluate`` still works afterwards."""
        self.replicas.close()
        for channel in (self._from_previous, self._to_next, self._from_next, self._to_previous):
            if channel is not None:
                channel.close()
        self.group.free()

    def evaluate(self, x: Any, y: Any, batch_size: int = 500) -> float:
        """Accuracy of the pipeline's current model on ``(x, y)`` (collective: every rank calls it between steps;
        stage 0 needs ``x``, the last stage ``y``, each replica its own part), on every rank. A forward pass only,
        on channels of its own, so batches in flight in the training pipeline are not disturbed."""
        correct = np.zeros(2)  # correct answers, examples: summed over the last stages of all replicas
        if (self.stage == 0 and x is None) or (self.last and y is None):
            raise ValueError("evaluate() needs x on stage 0 and y on the last stage")
        previous, following = self.grid.previous(self.engine.rank), self.grid.next(self.engine.rank)
        receive = Channel(self.engine, previous, PipelineTag.EVALUATION) if previous is not None else None
        send = Channel(self.engine, following, PipelineTag.EVALUATION) if following is not None else None
        start = chunk = 0
        while True:
            chunk += 1
            inputs = np.asarray(x[start : start + batch_size]) if self.stage == 0 else receive.recv(chunk)
            if len(inputs) == 0:
                if send is not None:
                    send.send(inputs, chunk)
                break
            output = np.asarray(self._apply(self.params, inputs))
            if send is not None:
                send.send(output, chunk)
            else:
                labels = np.asarray(y[start : start + len(inputs)])
                correct += [float((output.argmax(1) == labels).sum()), len(inputs)]
            start += len(inputs)
        for channel in (receive, send):  # everything was received: the empty chunk ended the stream
            if channel is not None:
                channel.close()
        self.engine.allreduce(correct)
        return float(correct[0] / correct[1])

    def _tick(self, x: Any, schedule: Schedule | None = None) -> float | None:
        schedule = schedule or self.schedule
        forward, backward = (
            schedule.forward_batch(self.stage, self.tick),
            schedule.backward_batch(self.stage, self.tick),
        )
        if forward is not None:
            self._forward(forward, x)
        loss = self._backward(backward) if backward is not None else None
        self.tick += 1
        return loss

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
            labelled, y = self._labels.popleft()
            assert labelled == batch
            value, error = self._loss_and_error(output, y)
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
    if isinstance(split, str):
        if split != "parameters":
            raise ValueError(
                f"split={split!r}: give 'parameters', a sample batch (an array) to time the layers on, or the stages' "
                "layer boundaries [0, ..., n]"
            )
        costs = [sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params)) for _, params in layers]
        return balanced_split(costs, stages)
    bounds = [int(b) for b in split]
    if len(bounds) != stages + 1 or bounds[0] != 0 or bounds[-1] != len(layers) or bounds != sorted(set(bounds)):
        raise ValueError(f"split={list(split)} must rise from 0 to {len(layers)} in {stages + 1} distinct boundaries")
    return bounds


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
