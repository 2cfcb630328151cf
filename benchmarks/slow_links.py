"""Issue 15's goals on the namespace cluster: the torch example across hosts joined by shaped links, strategies
side by side, and the bytes each worker sends per step as the cluster grows. Needs root (it makes the cluster).

    sudo python benchmarks/slow_links.py --hosts 8 --rate 100mbit --repeats 3 --sizes 4 8 16 --out docs/slow_links

1. Strategies: ``fast bench --framework torch --hostfile H -n 8`` with every strategy of ``--strategies``, in
   interleaved rounds, medians (job wall-clock from the common start to the last rank's stop, time to the target
   validation accuracy of the consensus model, its final test accuracy, FAST's bytes per step); its table, CSV and
   plots (accuracy against time) go to ``--out``/bench.
2. Bytes against N: for each size, a cluster of that many hosts; ``fast run`` of the torch example for 1 and 3
   epochs per strategy; each host link's tc counters, differenced between the two runs and divided by the
   difference in steps, give what each worker put on its link per step (launch and start-up taken out), headers
   included. All-reduce's figure is measured on the links here, not FAST's ring formula.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cluster_bench
import netns_cluster as nc

HERE = Path(__file__).resolve()
STRATEGIES = [
    "allreduce",
    "allreduce:compress=fp16",
    "dpsgd:ring",
    "dpsgd:ring,compress=int8",
    "choco:ring,compress=topk:ratio=0.1",
    "diloco:period=16,momentum=0.5",
    "async:ring",
]
EXAMPLE = "fast_examples.torch_mnist1d"


def environment() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **nc.environment())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    return env


def bench(
    hosts: int, strategies: list[str], repeats: int, epochs: int, target: float, out: Path, extra: list[str]
) -> list[dict]:
    """fast bench across the cluster now up (``extra``: the example's own arguments); its rows from results.csv."""
    hostfile = nc.FOLDER / "hosts"
    command = [sys.executable, "-m", "fast_core.cli", "bench", "--framework", "torch", "--hostfile", str(hostfile)]
    command += ["-n", str(hosts), "--repeats", str(repeats), "--epochs", str(epochs), "--target", str(target)]
    command += [item for spec in strategies for item in ("--strategy", spec)] + ["--run-dir", str(out)]
    command += ["--", *extra] if extra else []
    subprocess.run(command, env=environment(), check=True, timeout=7200)
    with open(out / "results.csv") as table:
        return list(csv.DictReader(table))


def bytes_against_size(sizes: list[int], rate: str, strategies: list[str]) -> list[tuple[int, str, float, float]]:
    """(N, strategy, tc bytes per worker per step, FAST's count for rank 0) on a cluster of each size."""
    rows = []
    for size in sizes:
        nc.down()
        hosts = nc.plan(size, rate)
        nc.up(hosts)
        with tempfile.TemporaryDirectory() as tmp:
            for strategy in strategies:
                steps1, counted1, sent1 = cluster_bench.train(hosts, Path(tmp), strategy, 1, environment(), EXAMPLE)
                steps3, counted3, sent3 = cluster_bench.train(hosts, Path(tmp), strategy, 3, environment(), EXAMPLE)
                per_step = [(b - a) / (steps3 - steps1) for a, b in zip(sent1, sent3, strict=True)]
                rows.append((size, strategy, sum(per_step) / len(per_step), (counted3 - counted1) / (steps3 - steps1)))
                print(rows[-1], flush=True)
    return rows


def plot_bytes(sizes: list[tuple[int, str, float, float]], path: Path) -> None:
    """Bytes per worker per step against N, each strategy's tc figure, with all-reduce's 2(N-1)/N x model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.5))
    for strategy in dict.fromkeys(s for _, s, _, _ in sizes):
        points = [(n, tc / 1e3) for n, s, tc, _ in sizes if s == strategy]
        axes.plot(*zip(*points, strict=True), marker="o", label=f"{strategy} (tc)")
    ring = [(n, fast / 1e3 / 2) for n, s, _, fast in sizes if s == "dpsgd:ring"]  # FAST counts 2 x the model
    if ring:
        model = ring[0][1]
        counts = sorted({n for n, _, _, _ in sizes})
        axes.plot(counts, [2 * (n - 1) / n * model for n in counts], "k--", label="2(N-1)/N x model")
    axes.set(xlabel="workers N", ylabel="kB per worker per step", ylim=(0, None))
    axes.set_xticks(sorted({n for n, _, _, _ in sizes}), labels=[str(n) for n in sorted({n for n, _, _, _ in sizes})])
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES)
    parser.add_argument("--sizes", type=int, nargs="*", default=[4, 8, 16])
    parser.add_argument("--out", type=Path, default=Path("slow_links"))
    parser.add_argument(
        "--example-args", default="", help="the torch example's own arguments, e.g. '--hidden 1024' (a larger model)"
    )
    args = parser.parse_args()
    reason = nc.why_not()
    if reason:
        raise SystemExit(f"cannot make the cluster: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        nc.down()
        nc.up(nc.plan(args.hosts, args.rate))
        extra = args.example_args.split()
        rows = bench(args.hosts, args.strategies, args.repeats, args.epochs, args.target, args.out / "bench", extra)
        sizes = bytes_against_size(args.sizes, args.rate, ["dpsgd:ring", "allreduce"]) if args.sizes else []
    finally:
        nc.down()
    report(args, rows, sizes)


def report(args: argparse.Namespace, rows: list[dict], sizes: list[tuple[int, str, float, float]]) -> None:
    base = next(r for r in rows if r["label"] == "allreduce")
    lines = [
        f"# The torch example across {args.hosts} hosts, links of {args.rate}\n",
        f"`sudo python benchmarks/slow_links.py --hosts {args.hosts} --rate {args.rate} --repeats {args.repeats} "
        f"--epochs {args.epochs} --sizes {' '.join(map(str, args.sizes))}"
        + (f" --example-args '{args.example_args}'" if args.example_args else "")
        + "`: network namespaces on one 2-core "
        f"machine (benchmarks/cluster.py), each host's link shaped by tc; `fast bench` runs every strategy once per "
        f"round, {args.repeats} rounds, medians; all ranks share the machine's 2 cores, so compute is slow too.\n",
        "| strategy | job wall-clock s | vs all-reduce | s to "
        f"{args.target:.0%} (consensus) | final test accuracy | kB sent/step (FAST) | bytes/step vs all-reduce |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = float(r["job_seconds"]) / float(base["job_seconds"])
        relative = float(r["bytes_sent_per_step"]) / float(base["bytes_sent_per_step"])
        reached = f"{float(r['seconds_to_target']):.2f}" if r["seconds_to_target"] else "not reached"
        lines.append(
            f"| `{r['label']}` | {float(r['job_seconds']):.2f} | {ratio:.2f}x | {reached} | "
            f"{float(r['final_accuracy']):.4f} | {float(r['bytes_sent_per_step']) / 1e3:.1f} | {relative:.2f}x |"
        )
    if sizes:
        lines += [
            "\n## Bytes each worker puts on its link per step, against N (tc, 3 epochs minus 1)\n",
            "| N | strategy | tc: bytes per worker per step | FAST's count (rank 0) |",
            "|---:|---|---:|---:|",
        ]
        lines += [f"| {n} | `{s}` | {tc / 1e3:.1f} kB | {fast / 1e3:.1f} kB |" for n, s, tc, fast in sizes]
        plot_bytes(sizes, args.out / "bytes_against_n.png")
        lines.append("\n![bytes per worker per step against N](bytes_against_n.png)")
        lines.append("\n![accuracy against time](bench/accuracy.png)")
    text = "\n".join(lines) + "\n"
    (args.out / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
