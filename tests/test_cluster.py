"""FAST across hosts over real TCP links (issue 15, point 1): a 4-host cluster on this machine (network namespaces on
a bridge, each link shaped to 100 Mbit/s by tc; benchmarks/netns_cluster.py), `fast run --hostfile` across it, and
the bytes and rates its links show. Skipped, saying why, where namespaces cannot be made (not root, no iproute2, a
container that refuses); the launcher's hostfile handling is checked everywhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fast_cli import fast

from fast_core.cli import launch
from fast_core.cli.launch import Job, first_host

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import links  # noqa: E402
import netns_cluster as nc  # noqa: E402

RATE = "100mbit"


# the launcher's side, everywhere ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, host",
    [("10.0.0.7\n10.0.0.8\n", "10.0.0.7"), ("# rack 1\n\n  node3:4  # four slots\nnode4:4\n", "node3"),
     ("node5 slots=8\n", "node5"), ("fe80::1\n", "fe80::1")],
)
def test_the_first_host_of_a_hostfile_is_found_in_hydras_and_open_mpis_forms(tmp_path: Path, text, host) -> None:
    (tmp_path / "hosts").write_text(text)
    assert first_host(str(tmp_path / "hosts")) == host


def test_with_a_hostfile_torch_rendezvous_goes_to_rank_0s_host_not_localhost(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("10.0.0.7\n10.0.0.8\n")
    monkeypatch.setattr(launch, "find_mpiexec", lambda explicit=None: "/usr/bin/mpiexec")
    monkeypatch.setattr(launch, "flavour", lambda mpiexec: "hydra")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29533")
    command, env = Job(["python", "train.py"], 4, hostfile=str(tmp_path / "hosts")).command()
    assert command[:5] == ["/usr/bin/mpiexec", "-n", "4", "-f", str(tmp_path / "hosts")]
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29533")  # the user's port is kept
    monkeypatch.setenv("MASTER_ADDR", "head")
    assert Job(["python", "train.py"], 4, hostfile=str(tmp_path / "hosts")).command()[1]["MASTER_ADDR"] == "head"


# a real cluster ---------------------------------------------------------------------------------------------------


def test_down_removes_every_namespace_and_link_and_can_run_twice(tmp_path: Path) -> None:
    reason = nc.why_not()
    if reason:
        pytest.skip(f"no namespace cluster on this machine: {reason}")
    hosts = nc.plan(2, "10mbit", {1: "1mbit"})
    if nc.namespaces():
        pytest.skip(f"a cluster is up already ({', '.join(nc.namespaces())}): `python benchmarks/cluster.py down`")
    nc.up(hosts, tmp_path)
    try:
        assert sorted(nc.namespaces()) == ["fast-h0", "fast-h1"]
        out = subprocess.run(["tc", "qdisc", "show", "dev", "fast-v1"], capture_output=True, text=True).stdout
        assert "rate 1Mbit" in out
        with pytest.raises(nc.ClusterError, match="exists already"):
            nc.up(hosts, tmp_path)
    finally:
        nc.down(tmp_path)
    assert nc.namespaces() == [] and not Path(f"/sys/class/net/{nc.BRIDGE}").exists()
    assert nc.down(tmp_path) == []  # idempotent
    assert not (tmp_path / "hosts").exists()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> tuple[list[nc.Host], Path]:
    """4 hosts at 100 Mbit/s, torn down whatever happens."""
    reason = nc.why_not()
    if reason:
        pytest.skip(f"no namespace cluster on this machine: {reason}")
    if nc.namespaces():
        pytest.skip(f"a cluster is up already ({', '.join(nc.namespaces())}): `python benchmarks/cluster.py down`")
    folder = tmp_path_factory.mktemp("cluster")
    hosts = nc.plan(4, RATE)
    try:
        nc.up(hosts, folder)
    except nc.ClusterError as error:
        pytest.skip(f"cannot make the cluster here: {error}")
    try:
        yield hosts, folder
    finally:
        nc.down(folder)


def test_fast_run_with_the_hostfile_trains_across_the_hosts_over_their_links(
    cluster, monkeypatch, tmp_path: Path
) -> None:
    hosts, folder = cluster
    for name, value in nc.environment(folder).items():  # what `cluster.py env` tells the user to export
        monkeypatch.setenv(name, value)
    before = nc.link_bytes(hosts)
    done = fast("run", "--hostfile", str(folder / "hosts"), "-n", "4", "--strategy", "dpsgd:ring",
                "-m", "fast_examples.numpy_digits", "--epochs", "2", timeout=90, cwd=tmp_path)
    after = nc.link_bytes(hosts)
    assert done.returncode == 0, done.stdout + done.stderr
    sent_by_rank0 = float(re.search(r"([0-9.]+) MB sent by rank 0", done.stdout).group(1)) * 1e6
    assert sent_by_rank0 > 0.1e6
    for host in hosts:  # ring D-PSGD: every rank sends as much as rank 0, all of it through its own link
        sent = after[host.namespace][0] - before[host.namespace][0]
        received = after[host.namespace][1] - before[host.namespace][1]
        assert sent >= 0.95 * sent_by_rank0, (host.namespace, sent, sent_by_rank0)
        assert received >= 0.95 * sent_by_rank0, (host.namespace, received, sent_by_rank0)


def test_an_mpi_transfer_between_two_hosts_runs_at_the_links_rate_as_a_raw_socket_does(cluster) -> None:
    hosts, folder = cluster
    nbytes = 12_000_000  # about 1 s at 100 Mbit/s
    env = dict(os.environ, **nc.environment(folder))
    before = nc.link_bytes(hosts[:2])
    seconds = links.run_mpi_p2p(f"{hosts[0].ip},{hosts[1].ip}", nbytes, 2, env)
    after = nc.link_bytes(hosts[:2])
    socket_seconds = links.tcp_p2p(hosts[0], hosts[1], nbytes, 2)
    rate = hosts[0].bits_per_second
    mpi, raw = (nbytes * 8 / min(s) / rate for s in (seconds, socket_seconds))
    assert 0.70 <= mpi <= 1.05, f"MPI at {mpi:.0%} of the link's {RATE}"
    assert 0.70 <= raw <= 1.05, f"a raw socket at {raw:.0%} of the link's {RATE}"
    assert mpi >= 0.85 * raw  # MPI adds little to TCP on a slow link
    carried = after[hosts[0].namespace][0] - before[hosts[0].namespace][0]
    assert 3 * nbytes <= carried <= 1.15 * 3 * nbytes  # warm-up and 2 timed, with TCP/IP headers: it crossed the link
    assert after[hosts[1].namespace][1] - before[hosts[1].namespace][1] >= 3 * nbytes
    for quiet in hosts[2:]:  # hosts 2 and 3 took no part
        assert nc.link_bytes([quiet])[quiet.namespace][0] < 0.05 * nbytes
