"""A cluster of hosts with slow links on this one machine (network namespaces, a bridge, tc), for MPI and fast run.

    sudo python benchmarks/cluster.py up --hosts 4 --rate 100mbit --slow 3:10mbit
    eval "$(python benchmarks/cluster.py env)"
    fast run --hostfile /tmp/fast-cluster/hosts -n 4 --strategy dpsgd:ring -m fast_examples.numpy_digits
    python benchmarks/cluster.py status        # each link's rate and the bytes it carried
    sudo python benchmarks/cluster.py down

See netns_cluster.py for how the hosts are made and why.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import netns_cluster as nc


def parse_slow(values: Sequence[str]) -> dict[int, str]:
    """``["3:10mbit", ...]`` -> {3: "10mbit", ...}."""
    slow = {}
    for value in values:
        index, sep, rate = value.partition(":")
        if not sep or not index.isdigit():
            raise SystemExit(f"--slow {value}: write HOST:RATE, e.g. --slow 3:10mbit")
        slow[int(index)] = rate
    return slow


def cmd_up(args: argparse.Namespace) -> int:
    if not 2 <= args.hosts <= 16:
        raise SystemExit(f"--hosts {args.hosts}: between 2 and 16")
    try:
        hosts = nc.plan(args.hosts, args.rate, parse_slow(args.slow))
        variables = nc.up(hosts, args.dir)
    except (ValueError, nc.ClusterError) as error:
        raise SystemExit(f"cluster.py up: {error}") from None
    for host in hosts:
        print(f"{host.namespace}  {host.ip}  {host.rate}")
    print(f"hostfile: {args.dir / 'hosts'}\nthen: eval \"$(python {sys.argv[0]} env)\"  (or: . {args.dir / 'env.sh'})")
    for name, value in variables.items():
        print(f"export {name}={value}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    removed = nc.down(args.dir)
    print(f"removed: {', '.join(removed)}" if removed else "nothing to remove")
    print(f"in a shell that exported `env`: unset {' '.join(nc.environment(args.dir))}  (mpiexec needs {nc.BRIDGE})")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    if not nc.load(args.dir):
        raise SystemExit(f"no cluster in {args.dir}: run `cluster.py up` first")
    for name, value in nc.environment(args.dir).items():
        print(f"export {name}={value}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    hosts, there = nc.load(args.dir), nc.namespaces()
    if not hosts:
        print(f"no cluster in {args.dir}" + (f"; stray namespaces: {', '.join(there)}" if there else ""))
        return 0 if not there else 1
    counts = nc.link_bytes([h for h in hosts if h.namespace in there])
    if args.json:
        print(json.dumps({h.namespace: {"ip": h.ip, "rate": h.rate, "bytes": counts.get(h.namespace)} for h in hosts}))
        return 0
    print(f"{'host':10} {'ip':12} {'rate':>9} {'sent MB':>10} {'received MB':>12}")
    for host in hosts:
        sent, received = counts.get(host.namespace, (float("nan"), float("nan")))
        print(f"{host.namespace:10} {host.ip:12} {host.rate:>9} {sent / 1e6:10.3f} {received / 1e6:12.3f}")
    missing = [h.namespace for h in hosts if h.namespace not in there]
    if missing:
        print(f"missing namespaces: {', '.join(missing)}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=nc.FOLDER, help="where the hostfile and launcher live")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make the hosts, the bridge and the shaped links; write the hostfile")
    up.add_argument("--hosts", type=int, default=4, help="how many hosts (2-16)")
    up.add_argument("--rate", default="100mbit", help="each link's rate, both ways (tc units: kbit, mbit, gbit)")
    up.add_argument("--slow", nargs="*", default=[], metavar="HOST:RATE", help="links of another rate, e.g. 3:10mbit")
    up.set_defaults(run=cmd_up)
    sub.add_parser("down", help="remove every namespace, link and file `up` made").set_defaults(run=cmd_down)
    sub.add_parser("env", help="the variables mpiexec needs, as export lines").set_defaults(run=cmd_env)
    status = sub.add_parser("status", help="the hosts and the bytes each link carried")
    status.add_argument("--json", action="store_true")
    status.set_defaults(run=cmd_status)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
