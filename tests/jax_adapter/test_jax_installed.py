"""The jax tox env installs its framework and nothing of the other two (adapter tests arrive with its issue)."""

import importlib.util

OTHERS = {"torch": ("tensorflow", "jax"), "tf": ("torch", "jax"), "jax": ("torch", "tensorflow")}["jax"]


def test_only_this_framework_is_installed() -> None:
    assert importlib.util.find_spec({"torch": "torch", "tf": "tensorflow", "jax": "jax"}["jax"]) is not None
    for other in OTHERS:
        assert importlib.util.find_spec(other) is None, f"{other} leaked into the jax env"
