"""What one shaped link of the namespace cluster (cluster.py) carries: MPI point to point against a raw TCP socket.

    sudo python benchmarks/cluster.py up --hosts 4 --rate 100mbit
    python benchmarks/links.py p2p --mb 20              # MPI rank 0 (host 0) -> rank 1 (host 1), and a raw socket
    python benchmarks/links.py p2p --mb 2 --pair 0 3    # host 0 -> host 3 (a --slow one: the slower link limits)

``p2p`` launches ``mpiexec -f hosts -n 2 python links.py mpi --mb MB`` (rank 0 on host 0 sends to rank 1 on host 1)
and times a raw socket between the same two namespaces, each ``--repeats`` times, and prints both in Mbit/s next to
the link's rate: a rate near the link's says that MPI's bytes crossed the shaped link (not shared memory) at the
link's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import netns_cluster as nc

HERE = Path(__file__).resolve()
PORT = 5201
CHUNK = 1 << 20


def mpi_p2p(nbytes: int, repeats: int) -> list[float]:
    """Seconds per transfer of ``nbytes`` from rank 0 to rank 1 (run under mpiexec, 2 ranks): rank 0 sends, rank 1
    answers with one byte once all arrived, so each time is the whole transfer and one small message back."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    data = np.ones(nbytes, np.uint8)
    done = np.zeros(1, np.uint8)
    times = []
    for repeat in range(repeats + 1):  # the first warms the connection up and is not counted
        comm.Barrier()
        start = time.perf_counter()
        if comm.rank == 0:
            comm.Send(data, 1)
            comm.Recv(done, 1)
        elif comm.rank == 1:
            comm.Recv(data, 0)
            comm.Send(done, 0)
        if repeat:
            times.append(time.perf_counter() - start)
    return times


def sink(port: int) -> None:
    """Accept one connection per transfer: read the announced byte count, all of it, then answer one byte."""
    with socket.create_server(("0.0.0.0", port)) as server:
        print("listening", flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                header = conn.recv(8, socket.MSG_WAITALL)
                if len(header) < 8:
                    return
                left = int.from_bytes(header, "big")
                while left:
                    got = conn.recv(min(CHUNK, left))
                    if not got:
                        break
                    left -= len(got)
                conn.sendall(b"k")


def source(ip: str, port: int, nbytes: int) -> float:
    """Seconds to send ``nbytes`` to ``sink`` on a fresh connection until its one-byte answer."""
    payload = b"\x01" * CHUNK
    with socket.create_connection((ip, port)) as conn:
        start = time.perf_counter()
        conn.sendall(nbytes.to_bytes(8, "big"))
        left = nbytes
        while left:
            left -= conn.send(payload[: min(CHUNK, left)])
        conn.recv(1)
        return time.perf_counter() - start


def in_namespace(namespace: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", namespace, sys.executable, str(HERE), *args]


def tcp_p2p(sender: nc.Host, receiver: nc.Host, nbytes: int, repeats: int) -> list[float]:
    """Seconds per raw-socket transfer of ``nbytes`` from ``sender``'s namespace to ``receiver``'s (one warm-up)."""
    server = subprocess.Popen(in_namespace(receiver.namespace, "sink", str(PORT)), stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()  # listening
        command = in_namespace(sender.namespace, "source", receiver.ip, str(PORT), str(nbytes), str(repeats))
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout
        return json.loads(out)
    finally:
        server.kill()
        server.wait()


def run_mpi_p2p(hosts: str, nbytes: int, repeats: int, env: dict[str, str] | None = None) -> list[float]:
    """``mpi_p2p`` from the first to the second of ``hosts`` (comma-separated) under mpiexec; seconds per
    transfer."""
    command = ["mpiexec", "-hosts", hosts, "-n", "2", sys.executable, str(HERE), "mpi", str(nbytes), str(repeats)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def mbit(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p2p = sub.add_parser("p2p", help="MPI and a raw socket from host 0 to host 1 of the cluster")
    p2p.add_argument("--mb", type=float, default=20, help="MB (1e6 bytes) per transfer")
    p2p.add_argument("--repeats", type=int, default=3)
    p2p.add_argument("--pair", type=int, nargs=2, default=[0, 1], metavar=("FROM", "TO"), help="host indices")
    p2p.add_argument("--dir", type=Path, default=nc.FOLDER)
    mpi = sub.add_parser("mpi", help="(run by p2p under mpiexec)")
    mpi.add_argument("nbytes", type=int)
    mpi.add_argument("repeats", type=int)
    sink_parser = sub.add_parser("sink", help="(run by p2p in the receiver's namespace)")
    sink_parser.add_argument("port", type=int)
    source_parser = sub.add_parser("source", help="(run by p2p in the sender's namespace)")
    source_parser.add_argument("ip")
    source_parser.add_argument("port", type=int)
    source_parser.add_argument("nbytes", type=int)
    source_parser.add_argument("repeats", type=int)
    args = parser.parse_args(argv)
    if args.command == "mpi":
        times = mpi_p2p(args.nbytes, args.repeats)
        if int(os.environ.get("PMI_RANK", "0")) == 0:
            print(json.dumps(times), flush=True)
    elif args.command == "sink":
        sink(args.port)
    elif args.command == "source":
        print(json.dumps([source(args.ip, args.port, args.nbytes) for _ in range(args.repeats + 1)][1:]))
    else:
        every = nc.load(args.dir)
        if len(every) < 2 or max(args.pair) >= len(every):
            raise SystemExit(f"no cluster with hosts {args.pair} in {args.dir}: run `cluster.py up` first")
        hosts = [every[i] for i in args.pair]
        nbytes = int(args.mb * 1e6)
        env = dict(os.environ, **nc.environment(args.dir))
        before = nc.link_bytes(hosts[:2])
        times = {"MPI": run_mpi_p2p(f"{hosts[0].ip},{hosts[1].ip}", nbytes, args.repeats, env)}
        after = nc.link_bytes(hosts[:2])
        times["raw TCP socket"] = tcp_p2p(hosts[0], hosts[1], nbytes, args.repeats)
        sent = after[hosts[0].namespace][0] - before[hosts[0].namespace][0]
        rate = min(h.bits_per_second for h in hosts) / 1e6
        links = " and ".join(h.rate for h in hosts)
        print(f"{hosts[0].namespace} -> {hosts[1].namespace}, links {links}, {args.mb:g} MB x {args.repeats}")
        for name, seconds in times.items():
            speeds = [mbit(nbytes, s) for s in seconds]
            best = max(speeds)
            print(f"  {name:15} {best:6.1f} Mbit/s best ({best / rate:.0%} of the link), all: "
                  + ", ".join(f"{s:.1f}" for s in speeds))
        print(f"  tc counted {sent / 1e6:.2f} MB sent by {hosts[0].namespace} during the MPI run "
              f"({sent / (nbytes * (args.repeats + 1)):.3f} x the payload)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
