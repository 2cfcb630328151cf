"""D-PSGD's start-up check: a mixing matrix that would bias the average is reported, a good one is not."""

from __future__ import annotations

import warnings

import pytest

from fast_core import LocalCluster, Worker
from fast_core.model.numpy_model import SoftmaxRegression


def _start(strategy: str) -> None:
    LocalCluster(4).run(lambda engine: Worker(SoftmaxRegression(3, 2), strategy, engine).start().close())


def test_biased_mixing_matrix_warns_with_the_fix() -> None:
    with pytest.warns(UserWarning, match="not column stochastic.*weights='metropolis'.*'sgp'"):
        _start("dpsgd:star")


@pytest.mark.parametrize("strategy", ["dpsgd:star,weights=metropolis", "dpsgd:ring", "dpsgd:exp", "dpsgd:exp1"])
def test_doubly_stochastic_mixing_is_silent(strategy: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _start(strategy)
