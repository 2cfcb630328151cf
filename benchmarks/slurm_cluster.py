"""A real SLURM on one machine: a controller and one slurmd per namespace host of netns_cluster.py.

    sudo python benchmarks/slurm_cluster.py up --hosts 4 --rate 100mbit   # --install: apt-get slurm-wlm munge first
    . /tmp/fast-slurm/env.sh                                             # SLURM_CONF: sbatch, srun, sinfo find it
    sbatch -N 4 --ntasks-per-node=1 examples/slurm/train.sbatch
    python benchmarks/slurm_cluster.py status
    sudo python benchmarks/slurm_cluster.py down                         # safe to run twice

Why: FAST's users launch under SLURM, and what SLURM does to a job (srun's MPI plugin, scancel, a node set DOWN, a
requeue) is only known by running it. Debian's ``slurm-wlm`` and ``munge``; one munged (its own key and socket in
FOLDER, so a system munge is left alone); slurmctld in the root namespace, reached by the hosts at the bridge's
address; on each host ``fast-h<i>`` a slurmd named after it, started inside its network namespace under its own
hostname (``unshare --uts``), so SLURM sees separate nodes with their own addresses and links shaped by tc as in
netns_cluster.py. The hosts share this machine's filesystem: every path is on a "shared filesystem". Ports 6917 and
6918 (not SLURM's 6817/6818), so a real SLURM on the machine is not disturbed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import netns_cluster as nc

FOLDER = Path("/tmp/fast-slurm")
"""slurm.conf, the munge key and socket, state, spool, pid and log files; ``down`` removes it."""
PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "sinfo")
CPUS = 2
"""CPUs each node declares: two tasks a node at most."""
CONF = """# Written by benchmarks/slurm_cluster.py: a SLURM of namespace hosts on one machine.
ClusterName=fast
SlurmctldHost={controller}({bridge})
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=300
SlurmdTimeout=30
InactiveLimit=0
Waittime=0
{nodes}
PartitionName=fast Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmClusterError(RuntimeError):
    """The SLURM cluster cannot be made here; the message says what and how to fix it."""


def why_not() -> str | None:
    """Why this machine cannot host the cluster (no namespaces, SLURM or munge missing), or None."""
    reason = nc.why_not()
    if reason:
        return reason
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install -y {' '.join(PACKAGES)} (or `up --install`)"
    return None


def install() -> None:
    """Debian's packages (what CI does before the tests): quiet, and a no-op once installed."""
    if all(shutil.which(d) for d in DAEMONS):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(["apt-get", "install", "-y", *PACKAGES], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SlurmClusterError(f"apt-get install -y {' '.join(PACKAGES)} failed: {done.stderr.strip()[-400:]}")


def environment(folder: Path = FOLDER) -> dict[str, str]:
    """What SLURM's commands need to find this cluster, and what its jobs inherit: UCX (MPICH's network layer) kept
    to TCP, since the hosts share this machine's /dev/shm (netns_cluster.environment says why)."""
    return {"SLURM_CONF": str(folder / "slurm.conf"), "UCX_TLS": "tcp"}


def config_text(hosts: list[nc.Host], folder: Path) -> str:
    """slurm.conf for ``hosts``: each its own NodeName and NodeAddr, CPUS CPUs."""
    nodes = "\n".join(f"NodeName={h.namespace} NodeAddr={h.ip} CPUs={CPUS} State=UNKNOWN" for h in hosts)
    return CONF.format(controller=socket.gethostname().split(".")[0], bridge=nc.BRIDGE_IP, folder=folder, nodes=nodes)


def _run(*command: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    if done.returncode != 0:
        raise SlurmClusterError(f"{' '.join(command)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def start_munge(folder: Path) -> None:
    """A munged of our own: a fresh key, its socket in ``folder`` (slurm.conf's AuthInfo names it)."""
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _run("munged", "--force", f"--socket={folder}/munge.sock", f"--key-file={key}", f"--pid-file={folder}/munged.pid",
         f"--log-file={folder}/log/munged.log", f"--seed-file={folder}/munged.seed")


CGROUPS = (
    "mount -t tmpfs cgroup_root /sys/fs/cgroup && mkdir /sys/fs/cgroup/freezer /sys/fs/cgroup/systemd && "
    "mount -t cgroup -o freezer cgroup /sys/fs/cgroup/freezer && "
    "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd"
)
"""``ip netns exec`` mounts a sysfs of the namespace's own over /sys, without /sys/fs/cgroup; slurmd 22.05 will not
start without a cgroup filesystem there (even under proctrack/linuxproc, task/none), and its v1 plugin stats the
systemd and freezer hierarchies: mounted again in the host's mount namespace, nothing else's."""


def start_slurmd(host: nc.Host, conf: Path) -> None:
    """slurmd for ``host``, in its network namespace under its own hostname (it daemonizes; its pid file is named
    after the node)."""
    inner = f'hostname {host.namespace} && {CGROUPS} && exec slurmd -f "{conf}" -N {host.namespace}'
    _run("ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c", inner)


def sinfo_states(folder: Path = FOLDER) -> dict[str, str]:
    """Each node's state as sinfo says (idle, alloc, down*, ...); empty if the controller does not answer."""
    env = dict(os.environ, **environment(folder))
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env, timeout=30)
    return dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)


def wait_idle(hosts: list[nc.Host], folder: Path, seconds: float = 60) -> None:
    """Until every node is idle, or a SlurmClusterError naming the states seen and the logs to read."""
    deadline = time.monotonic() + seconds
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = sinfo_states(folder)
        if all(states.get(h.namespace) == "idle" for h in hosts):
            return
        time.sleep(0.5)
    raise SlurmClusterError(f"nodes not idle after {seconds:g} s: {states or 'no answer'}; see {folder}/log/")


def up(count: int, rate: str, folder: Path = FOLDER) -> list[nc.Host]:
    """The namespace hosts, munge, slurmctld and a slurmd each, every node idle; refuses if any is up already
    (``down`` first). On failure removes what it made before raising."""
    reason = why_not()
    if reason:
        raise SlurmClusterError(reason)
    if (folder / "slurm.conf").exists() or nc.namespaces():
        raise SlurmClusterError(f"a cluster exists already ({folder}, {', '.join(nc.namespaces())}): `down` first")
    hosts = nc.plan(count, rate)
    try:
        nc.up(hosts, folder / "net")
        for sub in ("state", "log", *(f"spool/{h.namespace}" for h in hosts)):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        conf = folder / "slurm.conf"
        conf.write_text(config_text(hosts, folder))
        (folder / "env.sh").write_text("".join(f"export {k}={v}\n" for k, v in environment(folder).items()))
        start_munge(folder)
        _run("slurmctld", "-f", str(conf))
        for host in hosts:
            start_slurmd(host, conf)
        wait_idle(hosts, folder)
        return hosts
    except BaseException:
        down(folder)
        raise


def _stop(pid_file: Path, seconds: float = 10) -> str | None:
    """SIGTERM the daemon a pid file names, SIGKILL it after ``seconds``; its name, or None if none ran."""
    try:
        pid = int(pid_file.read_text().split()[0])
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return None
    if name not in ("slurmctld", "slurmd", "munged"):  # a pid reused by something else: not ours
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    return f"{name} {pid}"


def down(folder: Path = FOLDER) -> list[str]:
    """Cancel every job, stop the daemons (slurmds first, munged last), remove the hosts and ``folder``; what was
    stopped and removed. Idempotent."""
    stopped = []
    if (folder / "slurm.conf").exists() and shutil.which("scancel"):
        env = dict(os.environ, **environment(folder))
        subprocess.run(["scancel", "--full", "--user=root"], capture_output=True, env=env, timeout=30)
    for pid_file in [*sorted(folder.glob("slurmd-*.pid")), folder / "slurmctld.pid", folder / "munged.pid"]:
        name = _stop(pid_file)
        if name:
            stopped.append(name)
    stopped += nc.down(folder / "net")
    shutil.rmtree(folder, ignore_errors=True)
    return stopped


def cmd_up(args: argparse.Namespace) -> int:
    try:
        if args.install:
            install()
        hosts = up(args.hosts, args.rate, args.dir)
    except (ValueError, nc.ClusterError, SlurmClusterError) as error:
        raise SystemExit(f"slurm_cluster.py up: {error}") from None
    for host in hosts:
        print(f"{host.namespace}  {host.ip}  {host.rate}  idle")
    print(f"then: . {args.dir / 'env.sh'}  (SLURM_CONF for sbatch, srun, squeue, sinfo)")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    removed = down(args.dir)
    print(f"stopped and removed: {', '.join(removed)}" if removed else "nothing to remove")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if not (args.dir / "slurm.conf").exists():
        print(f"no SLURM cluster in {args.dir}")
        return 0
    states = sinfo_states(args.dir)
    print(json.dumps(states) if states else "slurmctld does not answer: see the logs in " + str(args.dir / "log"))
    return 0 if states else 1


COMMANDS = {"up": cmd_up, "down": cmd_down, "status": cmd_status}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=FOLDER, help="where slurm.conf, state and logs live")
    sub = parser.add_subparsers(dest="command", required=True)
    up_ = sub.add_parser("up", help="make the hosts and start munge, slurmctld and a slurmd per host")
    up_.add_argument("--hosts", type=int, default=4, help="how many hosts (nodes)")
    up_.add_argument("--rate", default="100mbit", help="each link's rate, both ways (tc units)")
    up_.add_argument("--install", action="store_true", help=f"apt-get install {' '.join(PACKAGES)} if missing")
    sub.add_parser("down", help="cancel the jobs, stop the daemons, remove the hosts")
    sub.add_parser("status", help="each node's state (sinfo), as JSON")
    args = parser.parse_args(argv)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
