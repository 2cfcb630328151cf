"""A model as a list of layers, and what one training step of it costs a node: the compute term of ``fast model``.

As Castello et al. (2021) model PyDTNN, each layer's forward pass is its GEMM: flops and bytes moved per step give an
arithmetic intensity, and its time is a roofline, flops / min(peak flop rate, memory bandwidth x intensity). The
backward pass is taken as twice the forward (two GEMMs per layer: gradients of the input and of the weights), the
optimizer's update as three passes over the parameters (read weight and gradient, write weight) at memory bandwidth,
and every step pays the framework's own time, a fixed part and a part per parameter byte (``Machine.step_overhead``
and ``step_overhead_per_byte``, measured by ``--calibrate``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fast_core.errors import ConfigError
from fast_core.perfmodel.machine import Machine

__all__ = ["Layer", "conv2d", "dense", "parse_layers", "step_compute_seconds"]


@dataclass(frozen=True)
class Layer:
    """One layer: forward flops per sample, its parameters, and the values it reads and writes per sample."""

    name: str
    flops: float
    params: int
    inputs: int
    outputs: int

    def forward_seconds(self, batch: int, machine: Machine) -> float:
        """Roofline time of the forward pass over ``batch`` samples."""
        flops = self.flops * batch
        moved = machine.dtype_bytes * (batch * (self.inputs + self.outputs) + self.params)
        rate = min(machine.peak_flops, machine.memory_bandwidth * flops / moved)
        return flops / rate


def dense(n_in: int, n_out: int, name: str = "dense") -> Layer:
    """A fully connected layer: 2 n_in n_out flops per sample, weights and bias."""
    return Layer(name, 2.0 * n_in * n_out, n_in * n_out + n_out, n_in, n_out)


def conv2d(c_in: int, c_out: int, kernel: int, height: int, width: int, name: str = "conv2d") -> Layer:
    """A 'same' 2-D convolution of a c_in x height x width input: 2 c_in k^2 flops per output value."""
    outputs = c_out * height * width
    return Layer(name, 2.0 * c_in * kernel * kernel * outputs, c_out * c_in * kernel * kernel + c_out,
                 c_in * height * width, outputs)


def parse_layers(text: str) -> list[Layer]:
    """``dense:64x128,dense:128x10`` or ``conv2d:1x32x3@28x28`` (c_in x c_out x kernel @ height x width)."""
    layers = []
    for item in text.split(","):
        kind, _, shape = item.strip().partition(":")
        try:
            if kind == "dense":
                n_in, n_out = (int(v) for v in shape.split("x"))
                layers.append(dense(n_in, n_out, f"dense{len(layers)}"))
            elif kind == "conv2d":
                channels, _, size = shape.partition("@")
                c_in, c_out, kernel = (int(v) for v in channels.split("x"))
                height, width = (int(v) for v in size.split("x"))
                layers.append(conv2d(c_in, c_out, kernel, height, width, f"conv{len(layers)}"))
            else:
                raise ValueError(kind)
        except ValueError:
            raise ConfigError(
                f"layer {item!r} is not understood; write dense:INxOUT or conv2d:CINxCOUTxK@HxW, e.g. "
                "dense:64x128,dense:128x10"
            ) from None
    if not layers:
        raise ConfigError("a model needs at least one layer, e.g. dense:64x128,dense:128x10")
    return layers


def parameter_count(layers: list[Layer]) -> int:
    return sum(layer.params for layer in layers)


def update_seconds(layers: list[Layer], machine: Machine) -> float:
    """The optimizer's update: three passes over the parameters (read weight and gradient, write weight)."""
    return 3 * parameter_count(layers) * machine.dtype_bytes / machine.memory_bandwidth


def step_compute_seconds(layers: list[Layer], batch: int, machine: Machine, slowdown: float = 1.0) -> float:
    """Forward + backward (2x forward) + the optimizer's update, ``slowdown`` times slower (ranks sharing cores),
    + the framework's time per step (measured with the job's ranks sharing the machine already)."""
    forward = sum(layer.forward_seconds(batch, machine) for layer in layers)
    update = update_seconds(layers, machine)
    overhead = machine.step_overhead + machine.step_overhead_per_byte * parameter_count(layers) * machine.dtype_bytes
    return (3 * forward + update) * slowdown + overhead
