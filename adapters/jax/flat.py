"""A params pytree as one flat host NumPy buffer and back: the per-step copy that JAX's immutable arrays need.

Both directions move each leaf once, straight between its device array and its slice of the host buffer, with no
intermediate array: ``to_numpy`` fetches all leaves in one ``jax.device_get`` (a view on the CPU) and copies each
into its slice; ``from_numpy`` puts every slice on the device in one ``jax.device_put``. That runs at about
``np.copyto`` speed; a jitted concatenation (or split) on the device first cost 8-20x ``np.copyto``, because it
writes the whole model once more (``benchmarks/adapter_overhead.py``). Nothing is traced, so nothing retraces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import jax
import jax.numpy as jnp
from fast_core import Engine
from fast_core.model.flat import FlatLayout, check_same_layout

BUFFER_DTYPES = ("float32", "float64")


def named_leaves(tree: Any) -> tuple[list[tuple[str, Any]], Any]:
    """The leaves of ``tree`` with '/'-joined key paths as names (e.g. 'dense1/w'), and the tree structure."""
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path, simple=True, separator="/"), leaf) for path, leaf in with_paths], treedef


def leaf_dtype(leaf: Any) -> np.dtype:
    """The dtype JAX gives this leaf (Python floats become float32 unless x64 is enabled)."""
    return np.dtype(jnp.result_type(leaf))


def host_leaves(tree: Any, engine: Engine) -> tuple[list[str], list[np.ndarray], Any]:
    """Names, host copies and structure of ``tree``'s leaves, after checking (collectively) that every rank holds
    the same leaves: a difference raises on every rank, naming the first leaf that differs."""
    named, treedef = named_leaves(tree)
    arrays = [np.asarray(jax.device_get(leaf), dtype=leaf_dtype(leaf)) for _, leaf in named]
    specs = [(name, a.shape, a.dtype) for (name, _), a in zip(named, arrays, strict=True)]
    check_same_layout(FlatLayout(specs, dtype="float64"), engine)
    return [name for name, _ in named], arrays, treedef


class FlatTree:
    """The flat layout of one params pytree, and the conversions between such pytrees and flat NumPy buffers.

    All floating leaves share one buffer, so by default they must share one dtype (float32 or float64). Pass
    ``dtype="float32"`` (or ``"float64"``) to pack leaves of several floating dtypes (e.g. bfloat16 and float32)
    into a buffer of that dtype: strategies then mix in that precision and each leaf is cast back to its own
    dtype on the way out. Non-floating leaves (integer counters, keys) are refused: keep them out of params.
    """

    def __init__(self, tree: Any, dtype: str | None = None) -> None:
        named, self.treedef = named_leaves(tree)
        if not named:
            raise ValueError("the params pytree has no leaves (arrays): there is nothing to train or average")
        dtypes = {name: leaf_dtype(leaf) for name, leaf in named}
        for name, kind in dtypes.items():
            if not jnp.issubdtype(kind, jnp.floating):
                raise TypeError(
                    f"params leaf '{name}' has dtype {kind}; FAST averages parameters, so every leaf must be "
                    "floating point: keep counters, keys and other state out of params (e.g. in opt_state)"
                )
        buffer_dtype = dtype if dtype is not None else _common_dtype(dtypes)
        if np.dtype(buffer_dtype).name not in BUFFER_DTYPES:
            raise TypeError(f"dtype={buffer_dtype!r}: the flat buffer must be one of {', '.join(BUFFER_DTYPES)}")
        self.layout = FlatLayout(
            [(name, np.shape(leaf), dtypes[name]) for name, leaf in named], dtype=np.dtype(buffer_dtype).name
        )
        self.dtype = self.layout.dtype
        self.leaf_dtypes: tuple[np.dtype, ...] = tuple(dtypes[name] for name, _ in named)  # bfloat16 has no name

    def leaves(self, tree: Any, what: str = "params") -> list[Any]:
        """The leaves of ``tree`` after checking it has this layout's structure and shapes."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if treedef != self.treedef:
            raise ValueError(
                f"{what} no longer has the structure FAST was started with: {treedef} vs {self.treedef}; "
                "the pytree must keep the same keys and leaves for the whole training"
            )
        for leaf, entry in zip(leaves, self.layout.entries, strict=True):
            if np.shape(leaf) != entry.shape:
                raise ValueError(f"{what} leaf '{entry.name}' has shape {np.shape(leaf)}, expected {entry.shape}")
        return leaves

    def to_numpy(self, tree: Any, out: np.ndarray | None = None, what: str = "params") -> np.ndarray:
        """Copy ``tree`` into one flat host buffer (``out``, or a new one), each leaf cast to the buffer's dtype."""
        hosts = jax.device_get(self.leaves(tree, what))  # one transfer for all leaves; views of them on the CPU
        out = self.layout.empty() if out is None else out
        for entry, host in zip(self.layout.entries, hosts, strict=True):
            out[entry.offset : entry.offset + entry.size] = np.reshape(host, -1)
        return out

    def from_numpy(self, flat: np.ndarray) -> Any:
        """A new pytree holding ``flat``'s values (one device_put of all slices); ``flat`` is not aliased."""
        if flat.shape != (self.layout.size,) or flat.dtype != self.dtype:
            raise ValueError(
                f"flat buffer is {flat.shape} {flat.dtype}; the layout needs ({self.layout.size},) {self.dtype}"
            )
        # Our own copy of each slice: on the CPU, device_put may alias a 64-byte-aligned NumPy array instead of
        # copying it (seen with jax 0.10, whatever may_alias says), and the strategies keep mixing into ``flat``.
        slices = [
            flat[entry.offset : entry.offset + entry.size].reshape(entry.shape).astype(dtype, copy=True)
            for entry, dtype in zip(self.layout.entries, self.leaf_dtypes, strict=True)
        ]
        return jax.tree_util.tree_unflatten(self.treedef, jax.device_put(slices))


def _common_dtype(dtypes: dict[str, np.dtype]) -> str:
    kinds = set(dtypes.values())
    if len(kinds) > 1:
        listed = ", ".join(f"'{name}' {kind}" for name, kind in dtypes.items())
        raise TypeError(
            f"params leaves have several dtypes ({listed}); FAST mixes one flat buffer, so convert them to one "
            "dtype or pass dtype='float32' (or 'float64') to mix in that precision and cast each leaf back"
        )
    kind = kinds.pop()
    if kind.name not in BUFFER_DTYPES:
        raise TypeError(
            f"params are {kind}; FAST mixes float32 or float64 buffers: pass dtype='float32' to mix in float32 and "
            f"cast the leaves back to {kind}"
        )
    return kind.name
