"""A cluster of N hosts on one Linux machine: one network namespace per host, joined by shaped links to one bridge.

Why: FAST's point is training over slow links between machines, which one machine's shared memory never shows.
Each host is a network namespace ``fast-h<i>`` with its own loopback and an ``eth0`` (one end of a veth pair) at
``10.77.0.<i+1>/24``; the other end ``fast-v<i>`` is a port of the bridge ``fast-br0`` (``10.77.0.254``) in the root
namespace, so mpiexec, running there, reaches every host. Each link is shaped by a token bucket (tc tbf) on the
egress of both ends, so a host sends and receives at its rate. MPI runs across it through hydra's ssh launcher,
replaced by ``launch.sh`` (written by ``up``): it runs hydra's proxy inside the host's namespace, under a hostname
of its own (``unshare --uts``) as on a real machine. Only iproute2 and tc, through subprocess; root needed.

Used by benchmarks/cluster.py (the command line) and tests/test_cluster.py (a pytest fixture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

PREFIX = "fast-h"
"""Namespaces are PREFIX0, PREFIX1, ...: ``down`` removes exactly those."""
BRIDGE = "fast-br0"
PORT = "fast-v"
"""The bridge-side end of host i's veth pair is PORT<i> (interface names have at most 15 characters)."""
SUBNET = "10.77.0"
BRIDGE_IP = f"{SUBNET}.254"
ETC = Path("/etc/netns")
"""``ip netns exec NS`` mounts the files of /etc/netns/NS over /etc's: each host's /etc/hosts names every host, so
that its hostname resolves to its address as on a real cluster (torch's gloo looks its own address up that way)."""
FOLDER = Path("/tmp/fast-cluster")
"""Where ``up`` writes the hostfile, the launcher and hosts.json (what ``down`` and ``status`` read)."""
UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
"""tc's rate units (decimal, as tc reads them), in bits per second."""


class ClusterError(RuntimeError):
    """Something on this machine stops the cluster from being made; the message says what and how to fix it."""


@dataclass(frozen=True)
class Host:
    """One host: its namespace, its address, its link's rate (tc syntax) and the bridge-side end of that link."""

    index: int
    namespace: str
    ip: str
    rate: str
    port: str

    @property
    def bits_per_second(self) -> float:
        return parse_rate(self.rate)


def parse_rate(rate: str) -> float:
    """Bits per second of a tc rate such as ``100mbit`` (tc's units: kbit = 1000 bit; no bytes units)."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", rate.lower())
    if found is None or found.group(2) not in UNITS:
        raise ValueError(f"rate {rate!r}: write a number and one of {', '.join(UNITS)}, e.g. 100mbit")
    return float(found.group(1)) * UNITS[found.group(2)]


def plan(hosts: int, rate: str, slow: dict[int, str] | None = None) -> list[Host]:
    """The hosts of a cluster: ``hosts`` of them (1 to 253) at ``rate``, except host i at ``slow[i]``."""
    if not 1 <= hosts <= 253:
        raise ValueError(f"--hosts {hosts}: between 1 and 253 (one /24 and the bridge)")
    slow = dict(slow or {})
    for index, value in [(-1, rate), *slow.items()]:
        parse_rate(value)
        if not -1 <= index < hosts:
            raise ValueError(f"--slow {index}:{value}: no host {index} among 0..{hosts - 1}")
    return [Host(i, f"{PREFIX}{i}", f"{SUBNET}.{i + 1}", slow.get(i, rate), f"{PORT}{i}") for i in range(hosts)]


def why_not() -> str | None:
    """Why this machine cannot make a cluster (not root, no ip or tc, namespaces refused), or None. Makes and removes
    one namespace to find out, since a container may have the tools and still refuse."""
    if os.geteuid() != 0:
        return "network namespaces and tc need root (run as root, e.g. sudo)"
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (install iproute2 and util-linux)"
    probe = f"{PREFIX}probe"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done


def namespaces() -> list[str]:
    """The namespaces of this machine that belong to a cluster (named PREFIX<i>)."""
    listed = _run("ip", "netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if re.match(rf"{PREFIX}\d+(\s|$)", line)]


def shape(device: str, rate: str, namespace: str | None = None) -> None:
    """A token bucket on ``device``'s egress: ``rate``, a burst of 10 ms at that rate (at least 32 KB, so that a
    full-size frame always fits), and at most 50 ms of queue before drops (what a switch port buffers)."""
    burst = max(32 * 1024, int(parse_rate(rate) / 8 / 100))
    where = ["ip", "netns", "exec", namespace] if namespace else []
    bucket = f"tbf rate {rate} burst {burst} latency 50ms".split()
    _run(*where, "tc", "qdisc", "replace", "dev", device, "root", *bucket)


def up(hosts: list[Host], folder: Path = FOLDER) -> dict[str, str]:
    """Make the cluster ``hosts`` describes and write its files into ``folder``; returns the environment to export
    (``environment``). Refuses if a cluster's namespaces or bridge exist already. On any failure, removes what it
    made before raising."""
    reason = why_not()
    if reason:
        raise ClusterError(reason)
    there = namespaces()
    if there or Path(f"/sys/class/net/{BRIDGE}").exists():
        raise ClusterError(f"a cluster exists already ({', '.join(there) or BRIDGE}): run `cluster.py down` first")
    try:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for host in hosts:
            _run("ip", "netns", "add", host.namespace)
            inside = ["ip", "netns", "exec", host.namespace]
            _run(*inside, "ip", "link", "set", "lo", "up")
            _run("ip", "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
            _run("ip", "link", "set", host.port, "master", BRIDGE)
            _run("ip", "link", "set", host.port, "up")
            _run(*inside, "ip", "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _run(*inside, "ip", "link", "set", "eth0", "up")
            _run(*inside, "ip", "route", "add", "default", "via", BRIDGE_IP)
            write_hosts(host, hosts)
            shape(host.port, host.rate)  # bridge -> host: what the host receives
            shape("eth0", host.rate, host.namespace)  # host -> bridge: what the host sends
        return write_files(hosts, folder)
    except BaseException:
        down(folder)
        raise


LAUNCHER = """#!/bin/sh
# Written by benchmarks/netns_cluster.py: hydra's "ssh" into one host of the cluster. Hydra calls it as
# `launch.sh [ssh options] host command...`; it runs the command as ssh would (one string, through sh) inside the
# host's network namespace, under the host's own hostname (a UTS namespace of its own). UCX (MPICH's network
# layer) would use shared memory between hosts, which share this machine's /dev/shm: only TCP unless told otherwise.
export UCX_TLS="${UCX_TLS:-tcp}"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case $host in
%s
  *) echo "launch.sh: $host is not a host of this cluster (see %s)" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$ns" "$*"
"""


def write_hosts(host: Host, hosts: list[Host]) -> None:
    """Host ``host``'s /etc/hosts (under /etc/netns): itself, loopback and every other host by name."""
    folder = ETC / host.namespace
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", *(f"{h.ip} {h.namespace}" for h in hosts), f"{BRIDGE_IP} {BRIDGE}"]
    (folder / "hosts").write_text("\n".join(lines) + "\n")


def write_files(hosts: list[Host], folder: Path = FOLDER) -> dict[str, str]:
    """The hostfile (one IP a line: one slot per host, so rank r runs on host r mod N), ``launch.sh``, ``env.sh``
    and ``hosts.json`` in ``folder``; returns the environment to export."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text("".join(f"{h.ip}\n" for h in hosts))
    cases = "\n".join(f"  {h.ip}|{h.namespace}) ns={h.namespace};;" for h in hosts)
    launcher = folder / "launch.sh"
    launcher.write_text(LAUNCHER % (cases, folder / "hosts.json"))
    launcher.chmod(0o755)
    (folder / "hosts.json").write_text(json.dumps([asdict(h) for h in hosts], indent=1) + "\n")
    variables = environment(folder)
    (folder / "env.sh").write_text("".join(f"export {k}={v}\n" for k, v in variables.items()))
    return variables


def environment(folder: Path = FOLDER) -> dict[str, str]:
    """What mpiexec (hydra) needs to run across the cluster, as environment variables so that ``fast run
    --hostfile`` works unchanged: the launcher, and the bridge as the interface whose address the hosts' proxies
    call back (the machine's hostname resolves to 127.0.0.1, which inside a namespace is the namespace itself); and
    UCX, MPICH's network layer, kept to TCP: hydra passes the ranks this environment, and with shared memory allowed
    UCX moves the bytes between hosts through this machine's /dev/shm (measured: 300 times the link's rate)."""
    return {
        "HYDRA_LAUNCHER": "ssh",
        "HYDRA_LAUNCHER_EXEC": str(folder / "launch.sh"),
        "HYDRA_IFACE": BRIDGE,
        "UCX_TLS": "tcp",
    }


def load(folder: Path = FOLDER) -> list[Host]:
    """The hosts ``up`` made, from ``folder/hosts.json``; empty if there is none."""
    try:
        return [Host(**h) for h in json.loads((folder / "hosts.json").read_text())]
    except (OSError, ValueError):
        return []


def down(folder: Path = FOLDER) -> list[str]:
    """Remove every cluster namespace (PREFIX<i>, whatever made it), the bridge and ``folder``'s files; what was
    removed. Idempotent. Deleting a namespace deletes its veth pair, and with it the bridge port and their qdiscs."""
    removed = []
    for namespace in sorted(namespaces(), key=lambda name: int(name[len(PREFIX) :])):
        _run("ip", "netns", "del", namespace)
        removed.append(namespace)
    for port in sorted(p.name for p in Path("/sys/class/net").glob(f"{PORT}*")):  # a half-made host's
        _run("ip", "link", "del", port, check=False)
        removed.append(port)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "del", BRIDGE)
        removed.append(BRIDGE)
    for etc in ETC.glob(f"{PREFIX}*"):
        if re.fullmatch(rf"{PREFIX}\d+", etc.name):
            shutil.rmtree(etc, ignore_errors=True)
    try:
        ETC.rmdir()  # only if empty: nothing else's
    except OSError:
        pass
    for name in ("hosts", "launch.sh", "env.sh", "hosts.json"):
        (folder / name).unlink(missing_ok=True)
    return removed


def qdisc_bytes(device: str, namespace: str | None = None) -> int:
    """Bytes sent so far by the root qdisc of ``device`` (``tc -s qdisc``): what crossed that end of the link."""
    where = ["ip", "netns", "exec", namespace] if namespace else []
    text = _run(*where, "tc", "-s", "qdisc", "show", "dev", device).stdout
    found = re.search(r"Sent (\d+) bytes", text)
    if found is None:
        raise ClusterError(f"no qdisc counters on {device}: {text.strip()}")
    return int(found.group(1))


def link_bytes(hosts: list[Host]) -> dict[str, tuple[int, int]]:
    """Per host, (bytes it sent, bytes it received) through its shaped link, counted by the two token buckets."""
    return {h.namespace: (qdisc_bytes("eth0", h.namespace), qdisc_bytes(h.port)) for h in hosts}
