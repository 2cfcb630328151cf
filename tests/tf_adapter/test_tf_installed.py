"""The tf env installs Keras 3 with all three of its backends, because fast_tf is tested on each of them."""

import importlib.metadata
import importlib.util


def test_keras_3_and_its_three_backends_are_installed() -> None:
    assert int(importlib.metadata.version("keras").split(".")[0]) >= 3
    for backend in ("tensorflow", "jax", "torch"):
        assert importlib.util.find_spec(backend) is not None, f"the Keras backend {backend} is missing from the tf env"
