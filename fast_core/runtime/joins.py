"""Workers asking to join a running job (``fast run --join RUN_DIR -n K``), and the running job's rank 0 taking them in.

The request and its answer are small JSON files in the job's run folder, ``joins/``: whoever asks writes
``<id>.ask.json`` (``{"workers": K}``, written whole: a temporary file renamed); the job's rank 0 looks for one about
once a second from its step (``JoinDesk.poll``), renames it ``<id>.taken.json`` so that it is served once, and asks
its group to grow (``FaultTolerant.ask_to_grow``: the group is revoked as after a loss, every rank shrinks it,
nobody is lost, and the group starts the new processes with ``grow``). Once they have joined, rank 0 writes
``<id>.answer.json``: the launch numbers they took, the step and the group's size, or why none joined. The new
processes are started by the job itself (MPI_Comm_spawn under Open MPI's launcher, threads of a LocalCluster), so
they run the job's own command line with its environment; the asker only asks and reads the answer.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path

from fast_core.engine import Engine
from fast_core.engine.capabilities import FaultTolerant
from fast_core.errors import ConfigError

log = logging.getLogger("fast")

JOINS = "joins"
"""The run folder's subfolder of join requests and answers."""
POLL_SECONDS = 1.0
"""How often rank 0 looks for a request: a growth waits at most this long, a step pays one clock read."""


def ask_to_join(run_dir: Path, workers: int) -> str:
    """Ask the job running in ``run_dir`` to take ``workers`` new workers in; returns the request's id."""
    if workers < 1:
        raise ConfigError(f"-n {workers}: give how many workers join the job, 1 or more")
    folder = run_dir / JOINS
    folder.mkdir(parents=True, exist_ok=True)
    request = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    _write(folder / f"{request}.ask.json", {"workers": workers, "asked_at": time.time()})
    return request


def answer_of(run_dir: Path, request: str) -> dict | None:
    """The job's answer to ``request`` (``{"joined": [...], "step": S, "size": N}`` or ``{"refused": why}``), or None
    while there is none."""
    path = run_dir / JOINS / f"{request}.answer.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def withdraw(run_dir: Path, request: str) -> bool:
    """Take back a request the job has not taken yet (the asker gave up waiting); True when it was still there."""
    try:
        (run_dir / JOINS / f"{request}.ask.json").unlink()
    except FileNotFoundError:
        return False
    return True


class JoinDesk:
    """Rank 0's side of the requests: polled from every step, it asks the group to grow and answers once they joined.
    Only a fault-tolerant engine with room to grow (``max_ranks`` above its size at some point) gets one."""

    def __init__(self, run_dir: Path, engine: Engine) -> None:
        self.folder = run_dir / JOINS
        self.engine = engine
        self._due = 0.0
        self._serving: list[str] = []

    @classmethod
    def for_job(cls, run_dir: Path | None, engine: Engine) -> JoinDesk | None:
        """A desk when the job may grow (a run folder, a fault-tolerant engine, ``max_ranks`` set), else None."""
        if run_dir is None or not isinstance(engine, FaultTolerant) or engine.max_ranks <= 0:
            return None
        return cls(run_dir, engine)

    def poll(self) -> None:
        """On the group's rank 0, about once per POLL_SECONDS: take the waiting requests and ask the group to grow
        (its next call then raises PeerLost on every rank and the change is survived as a loss would be)."""
        if self.engine.rank != 0 or self._serving:
            return
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + POLL_SECONDS
        asked = 0
        for request, workers in self._take():
            self._serving.append(request)
            asked += workers
        if not asked:
            return
        room = self.engine.max_ranks - self.engine.size
        if room <= 0:
            self.answer(refused=f"the job has {self.engine.size} ranks, its most (--max-ranks {self.engine.max_ranks})")
            return
        log.warning("rank 0: %d worker(s) asked to join; the group takes %d in", asked, min(asked, room))
        self.engine.ask_to_grow(min(asked, room))

    def answer(self, joined: tuple[int, ...] = (), step: int | None = None, refused: str | None = None) -> None:
        """Answer the requests being served (rank 0, once the group changed): who joined, or why nobody did."""
        if not self._serving:
            return
        if refused is None and not joined:
            refused = "the group could not start new processes (see the job's log)"
        body = {"refused": refused} if refused else {"joined": list(joined), "step": step, "size": self.engine.size}
        for request in self._serving:
            _write(self.folder / f"{request}.answer.json", body)
        self._serving.clear()

    def _take(self) -> list[tuple[str, int]]:
        """The requests waiting, each renamed ``.taken`` so it is served once; a malformed one is answered as such."""
        try:
            names = sorted(p.name for p in self.folder.iterdir() if p.name.endswith(".ask.json"))
        except FileNotFoundError:
            return []
        taken = []
        for name in names:
            request = name[: -len(".ask.json")]
            path = self.folder / f"{request}.taken.json"
            try:
                (self.folder / name).rename(path)
                workers = json.loads(path.read_text())["workers"]
            except FileNotFoundError:  # withdrawn meanwhile
                continue
            except (json.JSONDecodeError, KeyError, TypeError):
                workers = None
            if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
                _write(self.folder / f"{request}.answer.json", {"refused": f"{name}: no whole number of workers >= 1"})
                continue
            taken.append((request, workers))
        return taken


def _write(path: Path, body: dict) -> None:
    """Write ``body`` whole: a reader sees the old file or the new one, never half of it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(body) + "\n")
    partial.replace(path)
