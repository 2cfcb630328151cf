"""DistributedStep: the user's (jitted) training step with a fast_core strategy run around it on a flat host copy.

``fast_jax.distributed`` (wrap.py) builds it and says which forms of step it takes. The user's function is called
as given (jit it yourself); mixing happens outside it, so it is traced once for the whole training.
``average(params, step=step)`` closes the step and gives the consensus model.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import optax

import jax
import jax.numpy as jnp
from fast_core import Budget, Engine, Strategy, Worker
from fast_core.engine.collectives import average_arrays
from fast_core.runtime.process import init

from .api import broadcast
from .flat import FlatTree, host_leaves
from .model import JaxModel

TrainStep = Callable[[Any, Any, Any], tuple[Any, Any, Any]]
GradStep = Callable[[Any, Any], tuple[Any, Any]]

FORMS = {
    False: "train_step(params, opt_state, batch) -> (params, opt_state, metrics)",
    True: "grad_step(params, batch) -> (grads, metrics)",
}


class DistributedStep:
    """A training step with a FAST strategy around it: ``params, opt_state, metrics = step(params, opt_state, batch)``.

    The first call (or :meth:`start`) checks every rank holds the same params structure and gives all ranks rank
    0's params and opt_state. ``step.worker`` is the fast_core Worker (metrics, group.consensus_distance()); at epoch
    ends call :meth:`end_epoch`, at the end :meth:`close` or ``fast_jax.average(params, step=step)``.
    """

    def __init__(
        self,
        fn: TrainStep | GradStep,
        strategy: Strategy,
        optimizer: optax.GradientTransformation | None,
        engine: Engine | None,
        dtype: str | None,
        log_every: int | None,
        budget: Budget | None = None,
        tensorboard: str | os.PathLike[str] | None = None,
    ) -> None:
        self.fn = fn
        self.budget = budget
        self.tensorboard = tensorboard
        self.strategy = strategy
        self.optimizer = optimizer
        self._engine = engine
        self._dtype = dtype
        self._log_every = log_every
        self._model: JaxModel | None = None
        self._worker: Worker | None = None

    @property
    def uses_optimizer(self) -> bool:
        """True for the gradient form (fast_jax applies the gradients through the optax optimizer)."""
        return self.optimizer is not None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = init()
        return self._engine

    @property
    def worker(self) -> Worker:
        """The fast_core Worker of this step: metrics, ``group.consensus_distance()`` of the params the step last
        returned."""
        if self._worker is None:
            raise RuntimeError("the step has not started: call it once, or step.start(params, opt_state), first")
        return self._worker

    @property
    def model(self) -> JaxModel:
        """The adapter the worker mixes: ``model.params_tree()`` is the params as the strategy left them."""
        if self._model is None:
            raise RuntimeError("the step has not started: call it once, or step.start(params, opt_state), first")
        return self._model

    def start(self, params: Any, opt_state: Any) -> tuple[Any, Any]:
        """Collective: check the model is the same on every rank and return rank 0's params and opt_state.

        The first call of the step does this by itself; call it to start earlier (e.g. to evaluate the start).
        """
        if self._worker is not None:
            return params, opt_state
        model = JaxModel(FlatTree(params, self._dtype), self.optimizer)
        model.load(params, opt_state)
        self._start_worker(model)
        model.load(model.params_tree(), broadcast(opt_state, 0, self.engine))
        return model.params_tree(), model.opt_state

    def _start_worker(self, model: JaxModel) -> None:
        """The worker, started: same layout on every rank (names the first differing leaf), rank 0's params, the
        strategy set up."""
        worker = Worker(
            model,
            self.strategy,
            self.engine,
            log_every=self._log_every,
            budget=self.budget,
            tensorboard=self.tensorboard,
        )
        worker.start()
        self._model, self._worker = model, worker

    def __call__(self, params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, Any]:
        if self._worker is None:
            params, opt_state = self.start(params, opt_state)
        model, worker = self._model, self._worker
        model.load(params, opt_state)
        if self.optimizer is None:  # the user's step updates: the strategy's hooks follow it
            params, opt_state, metrics = unpack(self.fn(model.params_tree(), model.opt_state, batch), FORMS[False], 3)
            model.load(params, opt_state)
            worker.run_step()
        else:  # the strategy sees the gradient, then fast_jax applies it
            grads, metrics = unpack(self.fn(model.params_tree(), batch), FORMS[True])
            model.load_grads(grads)
            worker.run_step(model.apply_own_gradient)
        record_metrics(worker, metrics, batch)
        return model.params_tree(), model.opt_state, metrics

    def end_epoch(self, params: Any, opt_state: Any, metric: float) -> tuple[Any, Any]:
        """Collective: tell the strategy an epoch ended with this rank's validation ``metric`` (higher is better).

        FAST then restarts every rank from the best replica (and, if asked, fresh optimizer state): use the
        returned params and opt_state. Other strategies return them unchanged.
        """
        model = self._model
        if model is None:
            raise RuntimeError("end_epoch() before the first step: there is no epoch to end")
        model.load(params, opt_state)
        self.worker.end_epoch(metric)
        return model.params_tree(), model.opt_state

    def close(self) -> None:
        """Complete the strategy's communication (call once, after the last step, on every rank). Idempotent."""
        if self._worker is not None:
            self._worker.close()

    def __repr__(self) -> str:
        form = "grad_step + optax" if self.optimizer is not None else "train_step"
        return f"DistributedStep({getattr(self.fn, '__name__', self.fn)!r}, {self.strategy!r}, {form})"


def average(tree: Any, *, step: DistributedStep | None = None, engine: Engine | None = None) -> Any:
    """The mean over ranks of every leaf of ``tree`` (collective; summed in float64, returned in each leaf's dtype).

    At the end of training pass the wrapped ``step``: its worker is closed first, so no message is still in
    flight, and its engine is used; the params every rank then holds (and saves) are the consensus model. Without
    ``step`` it is a plain collective that leaves the step running, e.g. to evaluate the consensus model
    mid-training (``tree`` itself is not changed: JAX arrays are immutable): every rank must call it at the same
    point, so under an asynchronous strategy the ranks wait for each other there.
    """
    if step is not None:
        step.close()
        engine = engine or step.engine
    engine = engine or init()
    names, arrays, treedef = host_leaves(tree, engine)
    for name, array in zip(names, arrays, strict=True):
        if not jnp.issubdtype(array.dtype, jnp.floating):  # bfloat16 too
            raise TypeError(f"leaf '{name}' has dtype {array.dtype}: only floating leaves can be averaged")
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(a) for a in average_arrays(arrays, engine)])


def unpack(result: Any, form: str, arity: int = 2) -> tuple[Any, ...]:
    """The wrapped function's result, checked to be the ``arity``-tuple ``form`` names."""
    if not isinstance(result, tuple | list) or len(result) != arity:
        got = f"a {len(result)}-tuple" if isinstance(result, tuple | list) else type(result).__name__
        raise TypeError(f"the wrapped function must be {form}; it returned {got}")
    return tuple(result)


def record_metrics(worker: Worker, metrics: Any, batch: Any) -> None:
    """Under `fast run`, a ``"loss"`` in the step's metrics (a dict) goes to the run records, with the batch's
    samples (the leading dimension of its first leaf). Free otherwise: ``float`` would wait for the step."""
    if not worker.records.wanted or not isinstance(metrics, Mapping) or "loss" not in metrics:
        return
    leaves = jax.tree_util.tree_leaves(batch)
    samples = {"samples": int(np.shape(leaves[0])[0])} if leaves and np.ndim(leaves[0]) else {}
    worker.records.step(loss=float(metrics["loss"]), **samples)
