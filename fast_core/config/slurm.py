"""What a SLURM allocation tells its processes through the environment: the nodes (``SLURM_JOB_NODELIST``, in
SLURM's compressed form ``node[01-04,07]``), the tasks on each (``SLURM_TASKS_PER_NODE``, ``2(x3),1``), and a task's
place in its step (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``).

Why here, in the configuration layer: ``fast run --slurm`` reads the allocation to launch the ranks, and each rank
reads its step's placement for ``local_rank()`` (the GPU it takes) without an allreduce; both parse the same forms.
Pure functions of strings, so every form SLURM writes is tested without a SLURM.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

NODELIST_FORM = "names and bracketed ranges joined by commas, e.g. node[01-04,07],gpu-[1-2]-[a,b]"
TASKS_FORM = "counts joined by commas, a count repeated as N(xK), e.g. 2(x3),1"


class SlurmError(ValueError):
    """SLURM's environment says something FAST cannot read; the message names the variable, its text and the form
    expected."""


def _split_top(text: str) -> list[str]:
    """``text`` cut at the commas outside brackets: ``a[1,2],b`` -> ``["a[1,2]", "b"]``."""
    parts = re.findall(r"(?:[^,\[\]]|\[[^\[\]]*\])+", text)
    if ",".join(parts) != text:  # what the pattern skipped: an unpaired bracket, an empty name
        raise SlurmError(f"nodelist {text!r}: a bracket does not pair or a name is empty; expected {NODELIST_FORM}")
    return parts


def _range(inside: str, whole: str) -> list[str]:
    """The values of one bracket's ``01-04,07,a``: numbers keep their zero padding (``01-04`` -> 01 02 03 04)."""
    values = []
    for item in inside.split(","):
        low, dash, high = item.partition("-")
        if not dash and item and re.fullmatch(r"[A-Za-z0-9_.]+", item):
            values.append(item)
        elif dash and low.isdigit() and high.isdigit() and int(low) <= int(high):
            width = len(low) if low.startswith("0") else 0
            values += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        else:
            raise SlurmError(f"nodelist {whole!r}: cannot read the range {item!r}; expected {NODELIST_FORM}")
    return values


def expand_nodelist(text: str) -> list[str]:
    """The host names of a SLURM nodelist, in SLURM's order: ``node[01-02],gpu-[1-2]-[a,b]`` -> node01 node02
    gpu-1-a gpu-1-b gpu-2-a gpu-2-b."""
    if not text.strip():
        raise SlurmError(f"nodelist {text!r} is empty; expected {NODELIST_FORM}")
    hosts: list[str] = []
    for part in _split_top(text.strip()):
        pieces = re.split(r"\[([^\[\]]*)\]", part)  # text, range, text, range, ..., text
        if not part or "[" in "".join(pieces[::2]) or "]" in "".join(pieces[::2]):
            raise SlurmError(f"nodelist {text!r}: cannot read {part!r}; expected {NODELIST_FORM}")
        names = [""]
        for i, piece in enumerate(pieces):
            choices = _range(piece, text) if i % 2 else [piece]
            names = [name + choice for name in names for choice in choices]
        hosts += names
    return hosts


def expand_tasks(text: str) -> list[int]:
    """Tasks per node from SLURM's form: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.strip().split(","):
        found = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if found is None:
            raise SlurmError(f"tasks per node {text!r}: cannot read {item!r}; expected {TASKS_FORM}")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


@dataclass(frozen=True)
class Allocation:
    """One SLURM job's allocation as its environment says: its id, its nodes and the tasks SLURM gives each."""

    job_id: str
    nodes: tuple[str, ...]
    tasks: tuple[int, ...]
    cpus_per_task: int | None = None
    gpus: str | None = None
    """What the job asked of GPUs (``SLURM_GPUS_PER_TASK``, ``SLURM_GPUS_ON_NODE`` ...), as SLURM wrote it."""

    @property
    def total_tasks(self) -> int:
        return sum(self.tasks)


def allocation(environ: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation this process runs in (an ``sbatch`` script, ``salloc``'s shell, an ``srun`` step), or None
    outside one. Raises SlurmError naming the variable when its text cannot be read, or when the nodes and the
    tasks per node disagree."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not listed:
        raise SlurmError(f"SLURM job {job} without SLURM_JOB_NODELIST: is this SLURM's environment, or a copy of it?")
    nodes = expand_nodelist(listed)
    per_node = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE") or ",".join("1" for _ in nodes)
    tasks = expand_tasks(per_node)
    if len(tasks) != len(nodes):
        raise SlurmError(
            f"SLURM_TASKS_PER_NODE={per_node!r} gives {len(tasks)} node(s), SLURM_JOB_NODELIST={listed!r} names "
            f"{len(nodes)}: they should agree"
        )
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    asked = ("SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_GPUS")
    gpus = next((f"{k}={env[k]}" for k in asked if env.get(k)), None)
    return Allocation(job, tuple(nodes), tuple(tasks), int(cpus) if cpus.isdigit() else None, gpus)


def step_placement(rank: int, size: int, environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(local rank, local size) from the SLURM step that started this process as rank ``rank`` of ``size``
    (``srun``), or None when SLURM did not start the ranks one task each: under mpiexec inside an allocation every
    rank inherits its batch step's ``SLURM_LOCALID=0``, which must not be believed."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_PROCID") != str(rank) or env.get("SLURM_STEP_NUM_TASKS") != str(size):
        return None
    local, node = env.get("SLURM_LOCALID", ""), env.get("SLURM_NODEID", "")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE")
    if not (local.isdigit() and node.isdigit() and per_node):
        return None
    try:
        counts = expand_tasks(per_node)
    except SlurmError:
        return None
    return (int(local), counts[int(node)]) if int(node) < len(counts) else None
