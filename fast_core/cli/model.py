"""``fast model --layers dense:64x512,dense:512x10 -n 16 --strategies allreduce,dpsgd:ring,every=4``: predicted step
time of each strategy (each answers what it sends: ``Strategy.cost_profile``).

``--calibrate`` measures this machine first (and ``--machine FILE`` keeps or reuses the figures); ``--sweep OUT``
draws Castello et al.'s five sweeps (batch size, node flop rate, memory bandwidth, link bandwidth, cluster size)
as a PNG of predicted step time per strategy, with the numbers in a CSV beside it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from pathlib import Path

from fast_core.cli.common import CLIError, positive, say
from fast_core.cli.strategy_options import add_strategy_options, chosen_strategies
from fast_core.perfmodel import Layer, Machine, Prediction, parse_layers, predict
from fast_core.perfmodel.layers import parameter_count
from fast_core.perfmodel.pipeline import decoupled_tick, gpipe_step, pipeline_terms
from fast_core.simulate import parse_rate
from fast_core.strategies.spec import StrategySpec

DEFAULT = ("allreduce", "dpsgd:ring", "async:torus", "ps", "localsgd:period=8", "easgd")
SWEEPS = {  # axis: (label, values as factors of the base, or absolute for size and batch)
    "batch": ("samples per rank per step", [8, 16, 32, 64, 128, 256, 512]),
    "peak_flops": ("node flop rate (x the base)", [0.25, 0.5, 1, 2, 4, 8]),
    "memory_bandwidth": ("memory bandwidth (x the base)", [0.25, 0.5, 1, 2, 4, 8]),
    "bandwidth": ("link bandwidth (x the base)", [0.01, 0.1, 0.25, 1, 4, 10]),
    "size": ("ranks", [2, 4, 8, 16, 32, 64, 128, 256]),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "model",
        help="predict each strategy's step time from a model's layers and the machine",
        description="Predict the time of one training step per strategy (Castello et al. 2021's analytical "
        "model): compute from the layers' flops and bytes (roofline), communication from link latency and "
        "bandwidth per strategy. --calibrate measures this machine first.",
    )
    parser.add_argument("--layers", default="dense:64x512,dense:512x10", help="dense:INxOUT,... or conv2d:CxKxk@HxW")
    parser.add_argument("-n", "--np", dest="size", type=positive, default=16, help="ranks")
    parser.add_argument("--batch", type=positive, default=64, help="samples per rank per step")
    add_strategy_options(parser, DEFAULT)
    parser.add_argument(
        "--ranks-per-machine", type=positive, help="ranks on one machine (default 1); --calibrate measures it"
    )
    parser.add_argument("--calibrate", action="store_true", help="measure this machine (a few seconds)")
    parser.add_argument("--machine", type=Path, help="a machine file: written by --calibrate, read otherwise")
    parser.add_argument("--bandwidth", help="override the link bandwidth (tc style: 100mbit, 10gbit)")
    parser.add_argument("--latency", type=float, help="override the one-way latency (seconds)")
    parser.add_argument("--dtype-bytes", type=int, choices=(2, 4, 8), help="bytes per parameter (default 8)")
    parser.add_argument("--allreduce", choices=("halving", "ring"), default="halving")
    parser.add_argument(
        "--stages", default="", help="pipeline layouts of K stages too, comma-separated (2,4): decoupled and GPipe"
    )
    parser.add_argument("--sweep", type=Path, metavar="OUT.png", help="draw the five sweeps (and OUT.csv)")
    parser.set_defaults(handler=main)


def machine_from(args: argparse.Namespace) -> Machine:
    if args.calibrate:
        from fast_core.perfmodel.calibrate import calibrate

        machine = calibrate(ranks_per_machine=args.ranks_per_machine or 1)
        if args.machine is not None:
            machine.save(args.machine)
            say(f"wrote {args.machine}")
    elif args.machine is not None:
        machine = Machine.load(args.machine)
    else:
        machine = Machine()
        say("no --machine or --calibrate: using default figures (1e11 flop/s, 10 GB/s, 1 Gbit/s links, 50 us)")
    changes = {}
    if args.bandwidth:
        changes["bandwidth"] = parse_rate(args.bandwidth)
    if args.latency is not None:
        changes["latency"] = args.latency
    if args.dtype_bytes:
        changes["dtype_bytes"] = args.dtype_bytes
    return dataclasses.replace(machine, **changes)


Chosen = list[tuple[str, StrategySpec]]
"""The strategies of the command line: (the string as given, its StrategySpec), parsed once."""


def predictions(
    args: argparse.Namespace, chosen: Chosen, layers: list[Layer], machine: Machine, size: int, batch: int
) -> list[Prediction]:
    return [
        predict(spec, layers, batch, size, machine, args.allreduce, args.ranks_per_machine or 1, label=label)
        for label, spec in chosen
    ]


def main(args: argparse.Namespace) -> int:
    chosen = chosen_strategies(args, DEFAULT)
    machine = machine_from(args)
    layers = parse_layers(args.layers)
    rows = predictions(args, chosen, layers, machine, args.size, args.batch)
    count = parameter_count(layers)
    print(f"{args.size} ranks, {count:,} parameters ({count * machine.dtype_bytes / 1e6:.2f} MB), batch {args.batch}")
    print(
        f"machine: {machine.peak_flops / 1e9:.1f} Gflop/s, {machine.memory_bandwidth / 1e9:.1f} GB/s, links "
        f"{machine.bandwidth * 8 / 1e9:.3g} Gbit/s and {machine.latency * 1e6:.3g} us ({machine.measured})"
    )
    print(f"{'strategy':<24} {'compute ms':>11} {'comm ms':>9} {'step ms':>9}")
    for p in rows:
        print(f"{p.strategy:<24} {p.compute * 1e3:>11.3f} {p.communication * 1e3:>9.3f} {p.step * 1e3:>9.3f}")
    for stages in (int(k) for k in args.stages.split(",") if k):
        rows += layouts(args, machine, layers, stages)
    for p in rows[len(chosen) :]:
        print(f"{p.strategy:<24} {p.compute * 1e3:>11.3f} {p.communication * 1e3:>9.3f} {p.step * 1e3:>9.3f}")
    best = min(rows, key=lambda p: p.step)
    print(f"fastest: {best.strategy}")
    if args.sweep is not None:
        sweep(args, chosen, layers, machine, args.sweep)
        say(f"wrote {args.sweep} and {args.sweep.with_suffix('.csv')}")
    return 0


def layouts(args: argparse.Namespace, machine: Machine, layers: list[Layer], stages: int) -> list[Prediction]:
    """Decoupled K x D and GPipe (K micro-batches) on the same ranks and global batch as data parallelism."""
    if stages < 2 or args.size % stages:
        raise CLIError(f"--stages {stages}: a pipeline needs 2 or more stages that divide the {args.size} ranks")
    replicas = args.size // stages
    terms = pipeline_terms(layers, args.batch * stages, args.size, stages, machine, args.ranks_per_machine or 1)
    comm = terms.allreduce + 2 * terms.message
    return [
        Prediction(f"decoupled {stages}x{replicas}", terms.compute + terms.update, comm, decoupled_tick(terms)),
        Prediction(f"gpipe {stages} stages", terms.compute + terms.update, comm, gpipe_step(terms, stages, stages)),
    ]


def sweep(args: argparse.Namespace, chosen: Chosen, layers: list[Layer], machine: Machine, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SWEEPS), figsize=(4 * len(SWEEPS), 3.5))
    table = []
    for ax, (axis, (label, values)) in zip(axes, SWEEPS.items(), strict=True):
        curves: dict[str, list[float]] = {label: [] for label, _ in chosen}
        for value in values:
            size, batch, changed = args.size, args.batch, machine
            if axis == "size":
                size = int(value)
            elif axis == "batch":
                batch = int(value)
            else:
                changed = dataclasses.replace(machine, **{axis: getattr(machine, axis) * value})
            for p in predictions(args, chosen, layers, changed, size, batch):
                curves[p.strategy].append(p.step)
                table.append([axis, value, p.strategy, p.compute, p.communication, p.step])
        for strategy, steps in curves.items():
            ax.plot(values, [s * 1e3 for s in steps], marker="o", label=strategy)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("predicted ms per step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    with out.with_suffix(".csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["axis", "value", "strategy", "compute_s", "communication_s", "step_s"])
        writer.writerows(table)
