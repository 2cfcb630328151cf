"""fast_jax.distributed: a transform of the user's (jitted) training step that runs a fast_core strategy around it.

Three forms, told apart by ``optimizer=`` and by how many arguments the function takes:

- ``distributed(train_step, strategy)`` with ``train_step(params, opt_state, batch) -> (params, opt_state,
  metrics)``: the user's step runs unchanged, then the strategy mixes the new params on the host. Enough for
  every strategy that exchanges parameters (dpsgd, async, adpsgd, easgd, sgp, gossip, localsgd, ps:mode=async).
- ``distributed(grad_step, strategy, optimizer=opt)`` with ``grad_step(params, batch) -> (grads, metrics)``:
  fast_jax applies the gradient through ``opt`` (one jitted optax update) after the strategy saw it, so strategies
  that exchange gradients (all-reduce, FAST, synchronous ps) can average or add to them. It returns a step with the same
  ``(params, opt_state, batch) -> (params, opt_state, metrics)`` signature and works for every strategy.
- ``distributed(train_step, strategy)`` with ``train_step(state, batch) -> (state, metrics)`` (two arguments, no
  optimizer): a Flax ``TrainState`` (or any pytree state), ``state, metrics = step(state, batch)``. Under
  all-reduce and FAST the function is ``grad_step(state, batch) -> (grads, metrics)`` and ``state.tx`` applies
  the gradient (see state.py).

Under `fast run`, a ``"loss"`` in a dict of metrics goes to the run records with the batch's samples.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import optax

from fast_core import Budget, Engine, Strategy
from fast_core.strategies.spec import resolve_strategy

from .state import STATE_FORMS, DistributedStateStep
from .step import FORMS, DistributedStep

TrainStep = Callable[[Any, Any, Any], tuple[Any, Any, Any]]
GradStep = Callable[[Any, Any], tuple[Any, Any]]
StateStep = Callable[[Any, Any], tuple[Any, Any]]


def distributed(
    fn: TrainStep | GradStep | StateStep | None = None,
    strategy: Strategy | str | None = None,
    *,
    optimizer: optax.GradientTransformation | None = None,
    engine: Engine | None = None,
    dtype: str | None = None,
    log_every: int | None = None,
    budget: Budget | None = None,
    tensorboard: str | os.PathLike[str] | None = None,
) -> DistributedStep | Callable[[TrainStep | GradStep | StateStep], DistributedStep]:
    """Wrap a training step so ``strategy`` runs around it on every call; usable as a decorator too.

    Without ``optimizer``, ``fn`` is ``train_step(params, opt_state, batch) -> (params, opt_state, metrics)``
    (parameter strategies), or, taking two arguments, ``train_step(state, batch) -> (state, metrics)`` on a Flax
    TrainState (``grad_step(state, batch) -> (grads, metrics)`` under gradient strategies). With an optax
    ``optimizer``, ``fn`` is ``grad_step(params, batch) -> (grads, metrics)`` and fast_jax applies the
    (strategy-processed) gradient with the optimizer: needed by all-reduce and FAST, fine for every strategy.
    With no ``strategy``: ``fast run --strategy``'s (FAST_STRATEGY), else all-reduce. ``dtype`` packs params of
    several floating dtypes into one buffer of that dtype (see FlatTree; the state form picks float32 itself).
    ``budget``: a shared work budget (``fast_core.Budget``; ``step.worker.claim_batch(n)`` before each batch, once
    the step started), None for ``fast run --budget-samples/--budget-seconds``'s, else none. ``tensorboard``: a
    folder where this rank writes its records (``step.worker.records``) as TensorBoard scalars while it trains, None
    for ``fast run --tensorboard``'s (the ``tensorboard`` extra).
    """
    if fn is None:
        return lambda f: distributed(
            f,
            strategy,
            optimizer=optimizer,
            engine=engine,
            dtype=dtype,
            log_every=log_every,
            budget=budget,
            tensorboard=tensorboard,
        )
    if not callable(fn):
        raise TypeError(f"distributed() wraps a function, got {type(fn).__name__}")
    if optimizer is not None and not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(
            f"optimizer must be an optax GradientTransformation (e.g. optax.sgd(0.1)), got {type(optimizer).__name__}"
        )
    resolved = resolve_strategy(strategy)
    if optimizer is None and _takes(fn, 2) and not _takes(fn, 3):
        return DistributedStateStep(fn, resolved, engine, dtype, log_every, budget, tensorboard)
    if optimizer is None and resolved.uses_gradients:
        raise ValueError(
            f"strategy {_spec_text(strategy, resolved)} exchanges gradients, so fast_jax must apply them through your "
            "optimizer: pass optimizer=<optax transformation> and a grad_step(params, batch) -> (grads, metrics) "
            "instead of train_step, e.g. fast_jax.distributed(grad_step, strategy, optimizer=optax.sgd(0.1)); "
            f"or, with a Flax TrainState, {STATE_FORMS[True]}"
        )
    _check_signature(fn, optimizer is not None)
    return DistributedStep(fn, resolved, optimizer, engine, dtype, log_every, budget, tensorboard)


def _spec_text(strategy: Strategy | str | None, resolved: Strategy) -> str:
    if strategy is None:
        return f"{resolved.name} (no strategy given: FAST_STRATEGY, else all-reduce)"
    return repr(strategy) if isinstance(strategy, str) else resolved.name


def _takes(fn: Callable, arity: int) -> bool | None:
    """Whether ``fn`` can be called with ``arity`` positional arguments; None when it has no signature to read."""
    try:
        inspect.signature(fn).bind(*range(arity))
    except ValueError:  # no signature to read (some builtins): the call itself will tell
        return None
    except TypeError:
        return False
    return True


def _check_signature(fn: Callable, gradient_form: bool) -> None:
    if _takes(fn, 3 if not gradient_form else 2) is False:
        form, other = FORMS[gradient_form], FORMS[not gradient_form]
        hint = "pass optimizer= for the gradient form" if not gradient_form else "drop optimizer= for that form"
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} cannot be called as {form}; for {other}, {hint}")
