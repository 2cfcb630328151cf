"""Keras variables as one flat NumPy buffer and back, and whole-job averages and broadcasts of variables.

No Keras backend lets NumPy share a variable's storage the way torch on the CPU does, so the adapter copies: one
read (each variable converted to NumPy and copied into its slice) and one write (each slice assigned to its
variable) per mixing step. ``read_flat`` and ``write_flat`` are that pair; ``benchmarks`` time them.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

from fast_core import Engine
from fast_core.engine.collectives import average_arrays, broadcast_arrays
from fast_core.model.flat import FlatLayout
from fast_core.runtime.process import init

FLOATS = ("float16", "float32", "float64")


def dtype_of(variable: keras.Variable) -> str:
    """The variable's dtype as Keras names it on every backend, e.g. ``"float32"``."""
    return keras.backend.standardize_dtype(variable.dtype)


def layout_of(variables: Sequence[keras.Variable], dtype: str | None = None) -> FlatLayout:
    """The flat layout of ``variables``, named by position and short name (e.g. ``"0:kernel"``).

    Positions, not paths: Keras numbers auto-named layers per process (``dense_3``), so two ranks that built one
    extra model would otherwise disagree about a model that is the same. Several dtypes are refused unless
    ``dtype`` names the buffer's (values are then cast on the way in and out).
    """
    specs = [(f"{i}:{v.name}", tuple(v.shape), dtype_of(v)) for i, v in enumerate(variables)]
    for name, _, kind in specs:
        if kind not in FLOATS:
            raise TypeError(f"variable '{name}' is {kind}; FAST mixes {', '.join(FLOATS)} variables only")
    kinds = {kind for _, _, kind in specs}
    if dtype is None and len(kinds) > 1:
        first = {kind: next(n for n, _, k in specs if k == kind) for kind in sorted(kinds)}
        listing = ", ".join(f"{kind} (first: '{name}')" for kind, name in first.items())
        raise TypeError(
            f"the trainable variables have several dtypes: {listing}; FAST mixes them as one buffer, so build every "
            "layer with the same dtype (keras.config.set_floatx(...) before building, or dtype= on each layer)"
        )
    return FlatLayout(specs, dtype=dtype)


def read_flat(variables: Sequence[keras.Variable], layout: FlatLayout, out: np.ndarray | None = None) -> np.ndarray:
    """Copy the variables' current values into one flat buffer of ``layout`` (``out`` is reused when given)."""
    out = layout.empty() if out is None else out
    if out.shape != (layout.size,) or out.dtype != layout.dtype:
        raise ValueError(f"out is {out.shape} {out.dtype}; the layout needs ({layout.size},) {layout.dtype}")
    for entry, variable in zip(layout.entries, variables, strict=True):
        out[entry.offset : entry.offset + entry.size] = variable.numpy().reshape(-1)
    return out


def write_flat(variables: Sequence[keras.Variable], layout: FlatLayout, flat: np.ndarray) -> None:
    """Assign each slice of ``flat`` to its variable; ``flat`` may be reused by the caller afterwards."""
    source = handoff(flat)
    for entry, variable in zip(layout.entries, variables, strict=True):
        variable.assign(source[entry.offset : entry.offset + entry.size].reshape(entry.shape))


def broadcast_variables(variables: Sequence[keras.Variable], engine: Engine, root: int = 0) -> None:
    """Overwrite the variables on every rank with ``root``'s (collective; one bit-exact message for all)."""
    _assign(variables, broadcast_arrays([v.numpy() for v in variables], engine, root))


def average_variables(variables: Sequence[keras.Variable], engine: Engine) -> None:
    """Replace the variables on every rank by their mean over ranks (collective; one message, summed in float64)."""
    _assign(variables, average_arrays([v.numpy() for v in variables], engine))


def _assign(variables: Sequence[keras.Variable], values: list[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)  # a new array nobody writes again: safe where JAX aliases NumPy memory


def handoff(flat: np.ndarray) -> np.ndarray:
    """A buffer the backend may keep: ``flat`` itself, except on JAX, which gets a copy FAST never writes again.

    On the CPU, JAX may alias suitably aligned NumPy memory instead of copying it (measured: a variable assigned
    from a view changed when the view was written afterwards), and computations dispatched asynchronously may read
    it later. TensorFlow and torch copy on conversion, so they get ``flat`` itself.
    """
    return np.array(flat, copy=True) if keras.backend.backend() == "jax" else flat


def floating(variables: Sequence[keras.Variable]) -> list[keras.Variable]:
    """The floating-point variables (e.g. BatchNorm statistics, not the integer seed states of dropout)."""
    return [v for v in variables if dtype_of(v) in FLOATS]


def consensus_weights(model: keras.Model, engine: Engine | None = None) -> list[np.ndarray]:
    """The consensus model's weights, in ``model.get_weights()`` order: the mean over ranks of every floating
    variable (the others, e.g. seed states, are this rank's own), e.g. to evaluate the consensus model mid-training
    in a copy (``keras.models.clone_model(model).set_weights(...)``) without touching this rank's model.

    Collective: every rank must call it at the same point (between fits, or from a callback's ``self.model``), so
    under an asynchronous strategy the ranks wait for each other there. ``fast_tf.Callback(average_at_end=True)``
    already leaves the consensus model in every rank's model at the end of fit.
    """
    weights = [v.numpy() for v in model.weights]
    floats = [i for i, v in enumerate(model.weights) if dtype_of(v) in FLOATS]
    averaged = average_arrays([weights[i] for i in floats], engine or init())
    for i, value in zip(floats, averaged, strict=True):
        weights[i] = value
    return weights


def consensus_model(model: keras.Model, engine: Engine | None = None, compile: bool = True) -> keras.Model:
    """A copy of ``model`` holding the consensus model (``consensus_weights``), e.g. to evaluate or save it
    mid-training: ``fast_tf.consensus_model(model).evaluate(x_val, y_val)``. This rank's model is left as it is.

    Collective, like ``consensus_weights``: every rank calls it at the same point. The copy is
    ``keras.models.clone_model(model)`` (a subclassed model needs ``get_config``/``from_config`` for that), compiled
    as ``model`` was when ``compile`` and ``model`` is compiled, so ``evaluate`` works as well as ``predict``.
    """
    weights = consensus_weights(model, engine)  # first: every rank takes part even if cloning fails below
    try:
        copy = keras.models.clone_model(model)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise TypeError(
            f"fast_tf.consensus_model cannot clone this {type(model).__name__}: keras.models.clone_model raised "
            f"{type(exc).__name__} (above); give a subclassed model get_config and from_config, or build a copy "
            "yourself and call copy.set_weights(fast_tf.consensus_weights(model))"
        ) from exc
    copy.set_weights(weights)
    config = model.get_compile_config() if compile and model.compiled else None
    if config is not None:
        copy.compile_from_config(config)
    return copy
