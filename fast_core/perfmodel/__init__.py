"""``fast model``: predicted time of a training step per strategy, from a model's layers and a machine's figures
(Castello et al. 2021's analytical approach), calibrated by a short measurement of the machine at hand."""

from fast_core.perfmodel.layers import Layer, conv2d, dense, parse_layers, step_compute_seconds
from fast_core.perfmodel.machine import Machine
from fast_core.perfmodel.predict import Prediction, modelled, predict

__all__ = [
    "Layer",
    "Machine",
    "Prediction",
    "conv2d",
    "dense",
    "modelled",
    "parse_layers",
    "predict",
    "step_compute_seconds",
]
