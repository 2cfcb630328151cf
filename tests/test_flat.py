"""FlatLayout: packing, views, fingerprints and the errors users hit."""

from __future__ import annotations

import numpy as np
import pytest

from fast_core.model.flat import FlatLayout


def _arrays():
    return {"conv.weight": np.arange(24.0).reshape(2, 3, 4), "conv.bias": np.array([1.0, 2.0]), "scale": np.float64(3)}


def test_pack_unpack_round_trip_and_offsets() -> None:
    arrays = _arrays()
    layout = FlatLayout.from_arrays(arrays)
    assert layout.size == 27 and layout.dtype == np.float64 and layout.nbytes == 27 * 8
    assert [e.offset for e in layout.entries] == [0, 24, 26]
    flat = layout.pack(arrays)
    np.testing.assert_array_equal(flat[:24], np.arange(24.0))
    views = layout.unpack(flat)
    for name, value in arrays.items():
        np.testing.assert_array_equal(views[name], value)
    views["conv.bias"][0] = 42.0  # unpack gives views, not copies
    assert flat[24] == 42.0


def test_fingerprint_is_equal_for_equal_layouts_and_differs_otherwise() -> None:
    a = FlatLayout([("w", (3, 4), "float32"), ("b", (4,), "float32")])
    b = FlatLayout([("w", (3, 4), "float32"), ("b", (4,), "float32")])
    c = FlatLayout([("w", (4, 3), "float32"), ("b", (4,), "float32")])
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 32
    assert a.fingerprint() != c.fingerprint()
    assert a.first_difference(b.describe()) is None
    assert (
        a.first_difference(c.describe())
        == "parameter #0: 'w' shape=(3, 4) dtype=float32 vs 'w' shape=(4, 3) dtype=float32"
    )
    shorter = FlatLayout([("w", (3, 4), "float32")])
    assert "'b' shape=(4,) dtype=float32 exists on one rank only" in a.first_difference(shorter.describe())


def test_mixed_dtypes_need_an_explicit_buffer_dtype() -> None:
    specs = [("w", (2,), "float32"), ("v", (2,), "float64")]
    with pytest.raises(TypeError, match=r"several dtypes \['float32', 'float64'\].*pass dtype="):
        FlatLayout(specs)
    assert FlatLayout(specs, dtype="float64").dtype == np.float64


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda L: L.pack({"w": np.zeros((2, 2))}), KeyError, "'b' of the layout is missing"),
        (lambda L: L.pack({"w": np.zeros((2, 3)), "b": np.zeros(2)}), ValueError, r"'w' has shape \(2, 3\)"),
        (lambda L: L.unpack(np.zeros(5)), ValueError, r"needs \(6,\)"),
        (lambda L: L.unpack(np.zeros(6, dtype=np.float32)), TypeError, "needs float64"),
    ],
)
def test_bad_buffers_are_named(call, error, pattern) -> None:
    layout = FlatLayout([("w", (2, 2), "float64"), ("b", (2,), "float64")])
    with pytest.raises(error, match=pattern):
        call(layout)


def test_duplicate_names_and_integer_buffers_are_refused() -> None:
    with pytest.raises(ValueError, match=r"repeated: \['w'\]"):
        FlatLayout([("w", (2,), "float32"), ("w", (3,), "float32")])
    with pytest.raises(TypeError, match="floating dtype"):
        FlatLayout([("step", (1,), "int64")])
