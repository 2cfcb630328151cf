"""The state form of fast_jax.distributed: ``state, metrics = step(state, batch)`` for a Flax ``TrainState``.

``train_step(state, batch) -> (state, metrics)`` is the usual Flax step; the state is any pytree, and its
``params`` (``state.params`` when it has them, else the whole state) are what the strategy sees. Only their
floating leaves are mixed: integer leaves (step counters, keys) are never averaged, and each rank keeps its own;
every other part of the state (``opt_state``, ``step``) stays the rank's own too. Leaves of several floating dtypes
(bfloat16 and float32) are mixed in float32 (float64 if any leaf is) and written back in their own dtype, unless
``dtype=`` says otherwise. At the start every rank takes rank 0's whole state, counters included.

Strategies that exchange gradients (all-reduce, FAST) need the gradient before it is applied, so under them the
wrapped function is ``grad_step(state, batch) -> (grads, metrics)`` and fast_jax applies the (averaged) gradient
as ``TrainState.apply_gradients`` does: one step of ``state.tx`` on ``state.params`` and ``state.opt_state``, and
``state.step + 1``. The state must then be a ``TrainState`` (or have ``params``, ``opt_state``, ``tx``, ``step``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import jax
import jax.numpy as jnp
from fast_core import Budget, Engine, Strategy

from .api import broadcast
from .flat import FlatTree, leaf_dtype
from .model import JaxModel
from .step import DistributedStep, record_metrics, unpack

STATE_FORMS = {
    False: "train_step(state, batch) -> (state, metrics)",
    True: "grad_step(state, batch) -> (grads, metrics)",
}
_TRAIN_STATE_FIELDS = ("params", "opt_state", "tx", "step", "replace")


class DistributedStateStep(DistributedStep):
    """``state, metrics = step(state, batch)``: a strategy around a Flax-style step on a whole training state.

    The first call (or :meth:`start`) gives every rank rank 0's state. ``step.worker``, :meth:`close` and
    ``fast_jax.average(state.params, step=step)`` work as for the other forms; :meth:`end_epoch` takes the state.
    """

    def __init__(
        self,
        fn: Any,
        strategy: Strategy,
        engine: Engine | None,
        dtype: str | None,
        log_every: int | None,
        budget: Budget | None = None,
        tensorboard: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(fn, strategy, None, engine, dtype, log_every, budget, tensorboard)
        self._gradients = strategy.uses_gradients

    @property
    def uses_optimizer(self) -> bool:
        """True under gradient strategies: fast_jax applies the gradients through ``state.tx``."""
        return self._gradients

    def start(self, state: Any) -> Any:  # type: ignore[override]
        """Collective: check the state is the same pytree on every rank and return rank 0's.

        The first call of the step does this by itself; call it to start earlier (e.g. to evaluate the start).
        """
        if self._worker is not None:
            return state
        if self._gradients:
            _check_train_state(state, self.strategy)
        state = broadcast(state, 0, self.engine)  # names the first leaf that differs between ranks
        params = params_of(state)
        mixed = floating(params)
        if not jax.tree_util.tree_leaves(mixed):
            raise TypeError("the state's params have no floating leaves: there is nothing for the strategy to mix")
        model = JaxModel(FlatTree(mixed, self._dtype or _mixing_dtype(mixed)), state.tx if self._gradients else None)
        model.load(mixed, state.opt_state if self._gradients else None)
        self._start_worker(model)  # the same layout and strategy everywhere; the params are rank 0's already
        return state

    def __call__(self, *args: Any) -> tuple[Any, Any]:  # type: ignore[override]
        if len(args) != 2:
            raise TypeError(
                f"this step wraps a two-argument function, so it is the state form: {STATE_FORMS[False]}, called as "
                f"step(state, batch), got {len(args)} arguments; for grad_step(params, batch) -> (grads, metrics) "
                "pass optimizer=<optax transformation> to fast_jax.distributed"
            )
        state, batch = args
        state = self.start(state)
        model, worker = self._model, self._worker
        if not self._gradients:  # the user's step updates: the strategy mixes the params it left
            state, metrics = unpack(self.fn(state, batch), STATE_FORMS[False])
            params = params_of(state)
            model.load(floating(params), None)
            worker.run_step()
            state = with_params(state, merge(params, model.params_tree()))
        else:  # the strategy sees the gradient, then the state's tx applies it
            grads, metrics = unpack(self.fn(state, batch), STATE_FORMS[True])
            model.load(state.params, state.opt_state)
            model.load_grads(_gradient_of(grads, state))
            worker.run_step(model.apply_own_gradient)
            state = state.replace(step=state.step + 1, params=model.params_tree(), opt_state=model.opt_state)
        record_metrics(worker, metrics, batch)
        return state, metrics

    def end_epoch(self, state: Any, metric: float) -> Any:  # type: ignore[override]
        """Collective: tell the strategy an epoch ended with this rank's validation ``metric`` (higher is better).

        FAST then restarts every rank from the best replica's params (and, if asked, fresh ``opt_state``): use
        the returned state. Other strategies return it unchanged.
        """
        model = self._model
        if model is None:
            raise RuntimeError("end_epoch() before the first step: there is no epoch to end")
        params = params_of(state)
        model.load(floating(params), state.opt_state if self._gradients else None)
        self.worker.end_epoch(metric)
        state = with_params(state, merge(params, model.params_tree()))
        return state.replace(opt_state=model.opt_state) if self._gradients else state


def params_of(state: Any) -> Any:
    """What the strategy mixes: ``state.params`` of a TrainState-like state, else the whole state."""
    return state.params if _has_params(state) else state


def with_params(state: Any, params: Any) -> Any:
    return state.replace(params=params) if _has_params(state) else params


def floating(tree: Any) -> Any:
    """``tree`` with its non-floating leaves (counters, keys) taken out: the leaves the strategy mixes."""
    return jax.tree_util.tree_map(lambda leaf: leaf if _is_floating(leaf) else None, tree)


def merge(tree: Any, mixed: Any) -> Any:
    """``tree`` with its floating leaves replaced, in order, by the leaves of ``mixed`` (from :func:`floating`)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    replacements = iter(jax.tree_util.tree_leaves(mixed))
    return jax.tree_util.tree_unflatten(
        treedef, [next(replacements) if _is_floating(leaf) else leaf for leaf in leaves]
    )


def _has_params(state: Any) -> bool:
    return hasattr(state, "params") and hasattr(state, "replace")


def _is_floating(leaf: Any) -> bool:
    return bool(jnp.issubdtype(leaf_dtype(leaf), jnp.floating))


def _mixing_dtype(tree: Any) -> str:
    """float64 when a leaf is float64, else float32: bfloat16 and float16 are mixed in float32."""
    return "float64" if any(leaf_dtype(leaf) == np.float64 for leaf in jax.tree_util.tree_leaves(tree)) else "float32"


def _check_train_state(state: Any, strategy: Strategy) -> None:
    missing = [field for field in _TRAIN_STATE_FIELDS if not hasattr(state, field)]
    if missing:
        raise TypeError(
            f"strategy {strategy.name} exchanges gradients, which fast_jax applies as TrainState.apply_gradients "
            f"does, but the state has no {', '.join(missing)}: use a flax.training.train_state.TrainState, or the "
            "gradient form fast_jax.distributed(grad_step, strategy, optimizer=<optax transformation>)"
        )
    kinds = {leaf_dtype(leaf).name for leaf in jax.tree_util.tree_leaves(state.params) if not _is_floating(leaf)}
    if kinds:
        raise TypeError(
            f"state.params has leaves of dtype {', '.join(sorted(kinds))}: under {strategy.name} every params leaf "
            "gets a gradient, so all must be floating; keep counters and keys out of params"
        )


def _gradient_of(grads: Any, state: Any) -> Any:
    if jax.tree_util.tree_structure(grads) != jax.tree_util.tree_structure(state.params):
        raise TypeError(
            f"the wrapped function must be {STATE_FORMS[True]} under a gradient strategy, with grads shaped like "
            "state.params (e.g. jax.grad(loss)(state.params, batch)); it returned something else as its first value"
        )
    return grads
