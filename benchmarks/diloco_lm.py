"""DiLoCo's headline result in miniature: the byte-level LM on 8 namespace hosts joined by slow links, all-reduce
against DiLoCo at H = 50, 100, 500 and Streaming DiLoCo, the same token budget. Needs root (it makes the cluster).

    sudo python benchmarks/diloco_lm.py --rate 10mbit --size tiny --steps 1000 --out docs/lm
    sudo python benchmarks/diloco_lm.py --rate 100mbit --size tiny --steps 1000 --out docs/lm

Douillard et al. 2023 (DiLoCo): with H = 500 inner steps, 8 workers reach the loss of fully synchronous training
with about 500x less communication. Here: ``benchmarks/netns_cluster.py`` makes 8 hosts (network namespaces on this
one machine) whose links are shaped by tc to ``--rate``; each strategy is one ``fast run`` of
``fast_examples.torch_lm`` across them with the same budget (``--steps`` steps per worker, batch and sequence of
the size), one after the other, in ``--repeats`` interleaved rounds. Per run: the consensus model's final
validation loss (rank 0's "result" record), the bytes every host's link sent (tc counters, before and after,
summed over the 8 hosts: headers, launch and start-up included), the job's wall-clock (the common start to the last
rank's stop, from the records) and the consensus model's validation loss over time (snapshots). Writes
``--out``/results.md (the table, medians over rounds) and loss_vs_time.png (round 1).

All 8 ranks share this machine's cores, so compute is far slower than on 8 real machines: read the ratios between
rows (bytes, wall-clock, loss), not absolute times.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import cluster_bench
import netns_cluster as nc

from fast_core.cli.summary import job_wall_clock
from fast_core.observers.runlog import read_run

HERE = Path(__file__).resolve()
STRATEGIES = [
    "allreduce",
    "diloco:period=50",
    "diloco:period=100",
    "diloco:period=500",
    "diloco:period=100,fragments=4",
]
"""The last is Streaming DiLoCo: each exchange carries a quarter of the model, four times as often."""


def environment() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **nc.environment())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    return env


def run(hosts: list[nc.Host], folder: Path, strategy: str, args: argparse.Namespace) -> dict:
    """One ``fast run`` of the LM across ``hosts``: its final loss, link bytes, wall-clock and loss curve."""
    run_dir = folder / re.sub(r"[^a-z0-9]+", "-", strategy)
    before = nc.link_bytes(hosts)
    command = [sys.executable, "-m", "fast_core.cli", "run", "--hostfile", str(cluster_bench.hostfile(hosts, folder))]
    command += ["-n", str(len(hosts)), "--strategy", strategy, "--no-progress", "--run-dir", str(run_dir)]
    command += ["-m", "fast_examples.torch_lm", "--size", args.size, "--epochs", str(args.steps // args.epoch_steps)]
    command += ["--steps-per-epoch", str(args.epoch_steps), "--snapshot-every", str(args.snapshot_every)]
    if args.max_corpus_bytes:
        command += ["--max-corpus-bytes", str(args.max_corpus_bytes)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment(), timeout=args.timeout, cwd=folder)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    after = nc.link_bytes(hosts)
    ranks = read_run(run_dir)
    result = next(r for r in ranks[0] if r["kind"] == "result")
    curve = sorted((r["time"], r["val_loss"]) for r in ranks[0] if r["kind"] == "consensus" and "val_loss" in r)
    return {
        "strategy": strategy,
        "val_loss": result["val_loss"],
        "link_bytes": sum(after[h.namespace][0] - before[h.namespace][0] for h in hosts),
        "seconds": job_wall_clock(ranks),
        "curve": curve,
    }


def median_row(rows: list[dict]) -> dict:
    keys = ("val_loss", "link_bytes", "seconds")
    return {"strategy": rows[0]["strategy"], **{k: statistics.median(r[k] for r in rows) for k in keys}}


def report(args: argparse.Namespace, rounds: list[list[dict]]) -> str:
    rows = [median_row([each[i] for each in rounds]) for i in range(len(rounds[0]))]
    base = next(r for r in rows if r["strategy"] == "allreduce")
    lines = [
        f"`{' '.join(['sudo python benchmarks/diloco_lm.py', *sys.argv[1:]])}`: {args.hosts} hosts, links of "
        f"{args.rate}, LM size {args.size}, {args.steps} steps per worker, medians of {len(rounds)} round(s).\n",
        "| strategy | final val. loss (consensus) | vs all-reduce | link bytes (all hosts) "
        "| fewer bytes than all-reduce "
        "| job wall-clock s | vs all-reduce |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['strategy']}` | {r['val_loss']:.4f} | {r['val_loss'] / base['val_loss'] - 1:+.1%} "
            f"| {r['link_bytes'] / 1e6:.1f} MB | {base['link_bytes'] / r['link_bytes']:.0f}x | {r['seconds']:.0f} "
            f"| {r['seconds'] / base['seconds']:.2f}x |"
        )
    return "\n".join(lines) + "\n\n![validation loss of the consensus model against time](loss_vs_time.png)\n"


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["curve"]:
            axes.plot(*zip(*r["curve"], strict=True), marker="o", markersize=2, label=r["strategy"])
    axes.set(xlabel="seconds since the common start", ylabel="validation loss, consensus model (nats/byte)")
    axes.set_title(title, fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--rate", default="10mbit")
    parser.add_argument("--size", default="tiny", choices=("tiny", "small", "gpt2"))
    parser.add_argument("--steps", type=int, default=1000, help="steps per worker: the same budget for every run")
    parser.add_argument("--epoch-steps", type=int, default=100, help="steps per worker between evaluations")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-corpus-bytes", type=int, help="text to read (tiny: 4 MB; 100000000: the whole library)")
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES)
    parser.add_argument("--snapshot-every", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=Path("docs/lm"))
    args = parser.parse_args()
    if args.steps % args.epoch_steps:
        raise SystemExit(f"--steps {args.steps}: a multiple of --epoch-steps {args.epoch_steps}")
    reason = nc.why_not()
    if reason:
        raise SystemExit(f"cannot make the cluster: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = []
    try:
        nc.down()
        hosts = nc.plan(args.hosts, args.rate)
        nc.up(hosts)
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(args.repeats):
                rounds.append([])
                for strategy in args.strategies:
                    rounds[-1].append(run(hosts, Path(tmp), strategy, args))
                    row = rounds[-1][-1]
                    print(f"round {index + 1} {strategy}: loss {row['val_loss']:.4f}, {row['link_bytes'] / 1e6:.1f} "
                          f"MB on the links, {row['seconds']:.0f} s", flush=True)  # fmt: skip
    finally:
        nc.down()
    text = report(args, rounds)
    title = f"LM {args.size}, {args.hosts} hosts at {args.rate}, {args.steps} steps"
    plot(rounds[0], args.out / "loss_vs_time.png", title)
    (args.out / "results.md").write_text(f"# DiLoCo in miniature: {args.hosts} hosts at {args.rate}\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
