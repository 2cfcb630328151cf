"""Per-step adapter overhead: moving a model's parameters into fast_core's flat NumPy buffer and back, per framework.

A strategy's mixing step reads the parameters as one flat buffer (``model.params()``, "flatten"), mixes into it in
place and hands it back (``model.set_params(buffer)``, "unflatten"). This benchmark times those calls of each
adapter, on the code paths a training step takes, for a ~1M- and a ~10M-parameter float32 MLP, against
``np.copyto`` of the same bytes, interleaved in the same process:

- torch: ``fast_torch.TorchModel`` (the parameters are views of the flat buffer);
- Keras 3: ``fast_tf.KerasModel`` (``new_step()`` then ``params()``; ``set_params``) on each Keras backend;
- JAX: ``fast_jax.JaxModel`` over a ``FlatTree`` (``load`` a new params pytree then ``params()``: device to host;
  ``set_params`` then ``params_tree()``: host to device).

Unflatten is timed twice: with the adapter's own buffer (what the strategies pass back) and with another buffer
(a real copy in). Every framework runs in its own child process (Keras reads ``KERAS_BACKEND`` once, at import),
which prints its medians as JSON; the parent writes the table.

    OMP_NUM_THREADS=1 python benchmarks/adapter_overhead.py --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from report import command_line, markers, write_section

NAME = "adapter_overhead"
START, END = markers(NAME)
MODELS: dict[str, tuple[int, ...]] = {"1M": (1000, 500, 500, 500, 10), "10M": (1000, 2000, 2000, 2000, 10)}
"""Layer widths of the MLPs (input, hidden..., output): 4 dense layers, 8 tensors, the same in every framework."""
FRAMEWORKS = ("torch", "torch:bfloat16", "torch:cuda", "jax", "keras:tensorflow", "keras:jax", "keras:torch")
RESULT = "RESULT "
"""Prefix of the child's JSON line on stdout (libraries may print their own lines there)."""


@dataclass
class Row:
    """Median seconds of one adapter's calls on one model, and of np.copyto of the same bytes beside them."""

    framework: str
    model: str
    parameters: int
    flatten: float
    unflatten_own: float
    unflatten_other: float
    copyto: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--framework",
        dest="frameworks",
        action="append",
        choices=FRAMEWORKS,
        help=f"measure only this one (repeat the flag for several; default: all of {', '.join(FRAMEWORKS)})",
    )
    parser.add_argument("--model", dest="models", action="append", choices=list(MODELS), help="default: all")
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds per model; medians reported")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (jit compilation, page faults)")
    parser.add_argument("--out", type=Path, help="Markdown file whose adapter_overhead section is written or replaced")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.frameworks = args.frameworks or list(FRAMEWORKS)
    args.models = args.models or list(MODELS)
    return args


def mlp_parameters(widths: Sequence[int]) -> int:
    return sum(a * b + b for a, b in pairwise(widths))


# timing ------------------------------------------------------------------------------------------------------------
def interleaved(fns: Sequence[Callable[[], None]], repeats: int, warmup: int) -> list[float]:
    """Median seconds of each function, run A B C A B C ... so machine noise hits all of them alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


@dataclass
class Case:
    """One adapter on one model: its step calls as callables, and a check that they move the right values."""

    parameters: int
    flatten: Callable[[], np.ndarray]
    unflatten: Callable[[np.ndarray], None]
    readback: Callable[[], np.ndarray] | None = None
    """The values the model holds now, when ``flatten`` does not give them (JAX's flatten loads its own trees)."""
    copy: Callable[[], None] | None = None
    """The baseline when not ``np.copyto`` of the host bytes: a staged torch model's plain device -> host plus
    host -> device copy of the same bytes (the pair a mixing step cannot do without)."""
    holds: Callable[[np.ndarray], np.ndarray] = np.copy
    """What the model keeps of values written to it (a bfloat16 model rounds them)."""


def measure(case: Case, repeats: int, warmup: int) -> tuple[float, float, float, float]:
    """Median seconds of flatten, unflatten from the adapter's own buffer, from another buffer, and np.copyto."""
    own = case.flatten()
    if case.flatten() is not own:
        raise RuntimeError("params() returned a different buffer on the second call; the benchmark assumes one")
    other = np.random.default_rng(0).standard_normal(own.size).astype(own.dtype)
    expected = case.holds(other)
    case.unflatten(other)  # a round trip through the model must give back what went in
    if not np.array_equal((case.readback or case.flatten)(), expected):
        raise RuntimeError("set_params then params() did not give back the values written")
    src, dst = other.copy(), np.empty_like(other)
    copy = case.copy or (lambda: np.copyto(dst, src))
    copyto, flatten, unflatten_own, unflatten_other = interleaved(
        [copy, case.flatten, lambda: case.unflatten(own), lambda: case.unflatten(other)],
        repeats,
        warmup,
    )
    return flatten, unflatten_own, unflatten_other, copyto


# one builder per framework: a model of these widths behind its adapter, as a Case -------------------------------
def torch_case(widths: Sequence[int]) -> Case:
    """fast_torch.TorchModel: params() returns the flat buffer the parameters are views of; nothing to invalidate."""
    import torch

    from fast_torch import TorchModel

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = TorchModel(torch.nn.Sequential(*layers[:-1]))
    return Case(model.layout.size, model.params, model.set_params)


def torch_staged_case(widths: Sequence[int], device: str, dtype: str) -> Case:
    """fast_torch.TorchModel of a model on ``device`` in ``dtype``, mixed through host copies in float32: flatten is
    ``new_step()`` (the model trained) then ``params()``, staging device -> host; unflatten stages host -> device.
    The baseline is the plain pair of copies of the same bytes (with the same casts) into a like host buffer."""
    import torch

    from fast_torch import TorchModel

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    module = torch.nn.Sequential(*layers[:-1]).to(device=device, dtype=getattr(torch, dtype))
    model = TorchModel(module)
    device_flat = model.groups.flats[0]
    host = torch.empty(model.layout.size, dtype=torch.float32, pin_memory=device == "cuda")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def flatten() -> np.ndarray:
        model.new_step()
        return model.params()

    def plain_copies() -> None:
        host.copy_(device_flat, non_blocking=device == "cuda")
        sync()
        device_flat.copy_(host, non_blocking=device == "cuda")
        sync()

    def holds(values: np.ndarray) -> np.ndarray:
        return torch.from_numpy(values).to(getattr(torch, dtype)).float().numpy()

    return Case(model.layout.size, flatten, model.set_params, copy=plain_copies, holds=holds)


def jax_case(widths: Sequence[int]) -> Case:
    """fast_jax.JaxModel: each flatten loads a params pytree the host buffer does not hold yet, as a step does, so
    params() runs FlatTree.to_numpy; each unflatten runs set_params and params_tree() (FlatTree.from_numpy), and
    waits for the device arrays, which the next step would need anyway."""
    import jax

    from fast_jax import FlatTree, JaxModel

    key = jax.random.PRNGKey(0)
    tree = {}
    for i, (a, b) in enumerate(pairwise(widths)):
        key, sub = jax.random.split(key)
        tree[f"dense{i}"] = {"w": jax.random.normal(sub, (a, b)) * a**-0.5, "b": jax.numpy.zeros(b)}
    twin = jax.tree_util.tree_map(lambda x: x + 0, tree)  # the same values in other arrays
    jax.block_until_ready(twin)
    model = JaxModel(FlatTree(tree))
    trees = [tree, twin]

    def flatten() -> np.ndarray:
        trees.reverse()
        model.load(trees[0], None)
        return model.params()

    def unflatten(flat: np.ndarray) -> None:
        model.set_params(flat)
        jax.block_until_ready(model.params_tree())

    return Case(model.layout.size, flatten, unflatten, lambda: model.flat.to_numpy(model.params_tree()))


def keras_case(widths: Sequence[int]) -> Case:
    """fast_tf.KerasModel on the backend KERAS_BACKEND names: new_step() (the model trained) then params() reads
    every variable; set_params writes every variable. On JAX the write waits for the new device arrays."""
    import keras

    from fast_tf import KerasModel

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(w, activation="relu") for w in widths[1:-1]] + [keras.layers.Dense(widths[-1])]
    model = KerasModel(keras.Sequential([keras.Input((widths[0],)), *layers]))
    wait: Callable[[Any], Any] | None = None  # TensorFlow and torch assign synchronously on the CPU
    if keras.backend.backend() == "jax":
        import jax

        wait = jax.block_until_ready

    def flatten() -> np.ndarray:
        model.new_step()
        return model.params()

    def unflatten(flat: np.ndarray) -> None:
        model.set_params(flat)
        if wait is not None:
            wait([v.value for v in model.variables])

    return Case(model.layout.size, flatten, unflatten)


def versions(framework: str) -> str:
    """The versions that matter for ``framework``'s numbers, for the table's footnote."""
    if framework.startswith("torch"):
        import torch

        return f"PyTorch {torch.__version__}"
    if framework == "jax":
        import jax

        return f"JAX {jax.__version__} ({jax.default_backend()})"
    import keras

    backend = keras.backend.backend()
    return f"Keras {keras.__version__} on {backend} {__import__(backend).__version__}"


def run_child(framework: str, models: Sequence[str], repeats: int, warmup: int) -> dict[str, Any]:
    """Measure one framework in this process (KERAS_BACKEND already set by the parent)."""
    builders = {
        "torch": torch_case,
        "torch:bfloat16": lambda widths: torch_staged_case(widths, "cpu", "bfloat16"),
        "torch:cuda": lambda widths: torch_staged_case(widths, "cuda", "float32"),
        "jax": jax_case,
    }
    build = builders.get(framework, keras_case)
    if framework == "torch:cuda" and not __import__("torch").cuda.is_available():
        return {"versions": "no CUDA device: the CUDA row is left out", "rows": []}
    rows = []
    for name in models:
        case, expected = build(MODELS[name]), mlp_parameters(MODELS[name])
        if case.parameters != expected:
            raise RuntimeError(f"{framework} built {case.parameters} parameters, expected {expected}")
        flatten, own, other, copyto = measure(case, repeats, warmup)
        rows.append(asdict(Row(framework, name, case.parameters, flatten, own, other, copyto)))
        del case
    return {"versions": versions(framework), "rows": rows}


def spawn(framework: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run this script as a child measuring ``framework`` and return what it printed."""
    env = dict(os.environ)
    if framework.startswith("keras:"):
        env["KERAS_BACKEND"] = framework.split(":", 1)[1]
    command = [sys.executable, __file__, "--child", framework, "--repeats", str(args.repeats)]
    command += ["--warmup", str(args.warmup)]
    for name in args.models:
        command += ["--model", name]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {framework} failed (exit {done.returncode}); see its stderr above")
    return json.loads(lines[-1].removeprefix(RESULT))


# report ------------------------------------------------------------------------------------------------------------
def label(framework: str) -> str:
    if framework.startswith("keras:"):
        return f"Keras ({framework.split(':', 1)[1]})"
    return {
        "torch": "torch",
        "torch:bfloat16": "torch, bfloat16 (staged)",
        "torch:cuda": "torch, CUDA (staged)",
        "jax": "JAX",
    }[framework]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def ratio(seconds: float, copyto: float) -> str:
    return f"{seconds / copyto:.2f}x"


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| framework (backend) | parameters | flatten ms | unflatten ms (own buffer) | unflatten ms (other buffer) "
        "| np.copyto ms | flatten / copyto | unflatten own / copyto | unflatten other / copyto |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {label(r.framework)} | {r.parameters:,} | {ms(r.flatten)} | {ms(r.unflatten_own)} "
            f"| {ms(r.unflatten_other)} | {ms(r.copyto)} | {ratio(r.flatten, r.copyto)} "
            f"| {ratio(r.unflatten_own, r.copyto)} | {ratio(r.unflatten_other, r.copyto)} |"
        )
    return "\n".join(lines)


def section(rows: Sequence[Row], library_versions: Sequence[str], args: argparse.Namespace) -> str:
    """The Markdown section this benchmark owns, markers included."""
    shapes = " and ".join(
        f"{'-'.join(map(str, w))} ({mlp_parameters(w):,} parameters)" for n, w in MODELS.items() if n in args.models
    )
    return "\n".join(
        [
            START,
            "## Adapter overhead per step (`benchmarks/adapter_overhead.py`)",
            "",
            f"`{command_line(None)}`",
            "",
            f"{', '.join(library_versions)}, NumPy {np.__version__}; {os.cpu_count()} CPUs, "
            f"{datetime.date.today()}; load average {args.load:.1f} when the run started (other jobs on the machine "
            "share its cores).",
            "",
            "What a mixing step costs an adapter beyond the mixing itself: flatten is `model.params()` on the path a "
            "training step takes (torch: `fast_torch.TorchModel.params()`; Keras: `fast_tf.KerasModel.new_step()` "
            "then `params()`, which reads every variable; JAX: `fast_jax.JaxModel.load()` of a new params pytree "
            "then `params()`, i.e. `FlatTree.to_numpy`, device to host), unflatten is `model.set_params(buffer)` "
            "(JAX: then `params_tree()`, i.e. `FlatTree.from_numpy`, host to device, waiting for the arrays; "
            "Keras on JAX also waits for the variables' new arrays). The strategies hand back the adapter's own "
            "buffer after mixing into it in place (own buffer); other buffer is a separate array of the same layout, "
            "a real copy in. The baseline is `np.copyto` of the same bytes (float32), timed in the same process, "
            "interleaved call by call with the adapter's calls; for the staged torch rows (a bfloat16 model on the "
            "CPU, a float32 model on a CUDA device, both mixed in float32 through host buffers) it is instead the "
            "plain pair of copies device -> host and host -> device of the same bytes with the same casts, so "
            "flatten + unflatten (own) against it is what staging adds. Float32 MLPs with ReLU, layer widths "
            f"{shapes}, 4 dense layers (8 tensors) in every framework; each framework (and Keras "
            f"backend) runs in its own process. Medians of {args.repeats} rounds after {args.warmup} warm-up rounds.",
            "",
            table(rows),
            END,
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(run_child(args.child, args.models, args.repeats, args.warmup)), flush=True)
        return
    args.load = os.getloadavg()[0]
    rows: list[Row] = []
    library_versions: list[str] = []
    started = time.perf_counter()
    for framework in args.frameworks:
        result = spawn(framework, args)
        rows += [Row(**r) for r in result["rows"]]
        library_versions.append(result["versions"])
        print(f"{framework} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    text = section(rows, list(dict.fromkeys(library_versions)), args)
    print(text)
    if args.out:
        write_section(args.out, NAME, text)
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
