"""FAST on the namespace cluster's 100 Mbit/s links: neighbour exchange against a raw socket, bytes per step.

    sudo python benchmarks/cluster.py up --hosts 8 --rate 100mbit
    python benchmarks/cluster_bench.py --mb 4 --workers 4 8

Exchange: every rank sends a float32 buffer to its right neighbour on a ring and receives one from its left
(exchange.py's ``bench_exchange``: raw ``comm.Sendrecv`` and FAST's ``engine.exchange``, interleaved), across all
hosts at once, so every link carries the buffer both ways; set against a raw TCP socket from host 0 to host 1
(links.py).
Bytes: ``fast run --hostfile -n N --strategy S`` of the NumPy digits example at 1 and 3 epochs; the tc counters of
each host's link, differenced between the two runs and divided by the difference in steps, give the bytes each worker
sent per step with launch and start-up (the same in both runs) taken out; next to FAST's own count for rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import links
import netns_cluster as nc

HERE = Path(__file__).resolve()
FAST = [sys.executable, "-m", "fast_core.cli"]
STRATEGIES = ("dpsgd:ring", "allreduce")


def ring(size_mb: float, repeats: int) -> None:
    """Under mpiexec: exchange.py's ring exchange; rank 0 prints seconds and bytes as JSON."""
    from exchange import bench_exchange
    from mpi4py import MPI

    row = bench_exchange(MPI.COMM_WORLD, size_mb, repeats, warmup=1)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps({"raw": row.raw.seconds, "fast": row.fast.seconds, "nbytes": row.raw.nbytes}), flush=True)


def hostfile(hosts: list[nc.Host], folder: Path) -> Path:
    path = folder / f"hosts{len(hosts)}"
    path.write_text("".join(f"{h.ip}\n" for h in hosts))
    return path


def run_ring(hosts: list[nc.Host], folder: Path, size_mb: float, repeats: int, env: dict[str, str]) -> dict:
    command = ["mpiexec", "-f", str(hostfile(hosts, folder)), "-n", str(len(hosts)), sys.executable, str(HERE),
               "ring", str(size_mb), str(repeats)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def train(
    hosts: list[nc.Host],
    folder: Path,
    strategy: str,
    epochs: int,
    env: dict[str, str],
    example: str = "fast_examples.numpy_digits",
) -> tuple[int, int, list[int]]:
    """One ``fast run`` of ``example`` across ``hosts``: (steps, bytes FAST counted for rank 0 (to 10 kB: it prints
    MB to two decimals), bytes each host's link sent)."""
    before = nc.link_bytes(hosts)
    command = [*FAST, "run", "--hostfile", str(hostfile(hosts, folder)), "-n", str(len(hosts)), "--strategy",
               strategy, "--no-progress", "-m", example, "--epochs", str(epochs)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=folder)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    after = nc.link_bytes(hosts)
    found = re.search(r"\((\d+) steps, ([0-9.]+) MB sent by rank 0\)", done.stdout)
    if found is None:
        raise SystemExit(f"no step count in the output of {' '.join(command)}:\n{done.stdout}")
    sent = [after[h.namespace][0] - before[h.namespace][0] for h in hosts]
    return int(found.group(1)), int(float(found.group(2)) * 1e6), sent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    inner = sub.add_parser("ring", help="(run under mpiexec)")
    inner.add_argument("size_mb", type=float)
    inner.add_argument("repeats", type=int)
    parser.add_argument("--mb", type=float, default=4, help="exchange buffer, MB (1e6 bytes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="cluster sizes for the byte counts")
    parser.add_argument("--dir", type=Path, default=nc.FOLDER)
    args = parser.parse_args(argv)
    if args.command == "ring":
        ring(args.size_mb, args.repeats)
        return 0
    every = nc.load(args.dir)
    if len(every) < max(args.workers):
        raise SystemExit(f"need a cluster of {max(args.workers)} hosts in {args.dir}: cluster.py up --hosts 8")
    env = dict(os.environ, OMP_NUM_THREADS="1", **nc.environment(args.dir))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
    rate = every[0].bits_per_second
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        nbytes = int(args.mb * 1e6)
        socket_s = statistics.median(links.tcp_p2p(every[0], every[1], nbytes, args.repeats))
        ring_row = run_ring(every, folder, args.mb, args.repeats, env)
        print(f"## Exchange on {len(every)} hosts, links {every[0].rate} ({args.mb:g} MB, median of {args.repeats})\n")
        print("| what | Mbit/s per rank, each way | of the link | of the raw socket |\n|---|---:|---:|---:|")
        socket_rate = nbytes * 8 / socket_s
        for name, seconds in (("raw socket, host 0 -> 1", socket_s), ("mpi4py Sendrecv ring", ring_row["raw"]),
                              ("FAST engine.exchange ring", ring_row["fast"])):
            bits = (ring_row["nbytes"] if "ring" in name else nbytes) * 8 / seconds
            print(f"| {name} | {bits / 1e6:.1f} | {bits / rate:.0%} | {bits / socket_rate:.0%} |")
        print("\n## Bytes each worker sends per training step (NumPy digits, 3 epochs minus 1 epoch)\n")
        print("| N | strategy | steps (3 epochs) | tc: bytes per worker per step (mean, min-max) | FAST: rank 0 |")
        print("|---:|---|---:|---:|---:|")
        for workers in args.workers:
            hosts = every[:workers]
            for strategy in STRATEGIES:
                steps1, counted1, sent1 = train(hosts, folder, strategy, 1, env)
                steps3, counted3, sent3 = train(hosts, folder, strategy, 3, env)
                per_step = [(b - a) / (steps3 - steps1) for a, b in zip(sent1, sent3, strict=True)]
                mean = sum(per_step) / len(per_step)
                print(f"| {workers} | {strategy} | {steps3} | {mean / 1e3:.1f} kB ({min(per_step) / 1e3:.1f}-"
                      f"{max(per_step) / 1e3:.1f}) | {(counted3 - counted1) / (steps3 - steps1) / 1e3:.1f} kB |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
