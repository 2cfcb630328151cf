"""The fault-tolerant MPI engine: a rank that dies is survived (Open MPI with ULFM, ``fast run --fault-tolerant``).

With ULFM (User Level Failure Mitigation, in Open MPI 5 under ``mpiexec --with-ft ulfm``) an MPI call that involves
a dead process returns MPI_ERR_PROC_FAILED instead of ending the job, once the communicator's error handler is
MPI_ERRORS_RETURN. Only the ranks that talk to the dead one see that error, so the first rank that sees it revokes
every communicator of the group (the engine's own, the duplicates its collective kinds and communication threads
use): from then on every pending or new call on them fails with MPI_ERR_REVOKED on every survivor, which raises
``PeerLost``. The Worker then stops its strategy's threads and calls ``shrink``: ``MPI_Comm_shrink`` gives the
survivors one agreed communicator, renumbered in their old order, on which the job goes on.

After a loss, Open MPI 5.0's MPI_Finalize sometimes waits forever on a fence that includes the dead process (about one
exit in eight here), so a fault-tolerant launch does not finalize: ``fast run --fault-tolerant`` sets
MPI4PY_RC_FINALIZE=0 (set it too when launching by hand); mpiexec then still ends with status 0.

A collective that fails must leave the caller's buffer as it was, so that the step can be run again over the
survivors: allreduce and broadcast here write into a scratch buffer and copy back only on success.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import NoReturn

import numpy as np

from fast_core.config.run import guard_command
from fast_core.engine.base import DEFAULT_TIMEOUT, Request
from fast_core.engine.capabilities import FaultTolerant
from fast_core.engine.mpi import MPIEngine, _error_text, _mpi
from fast_core.errors import FastError, PeerLost, PeerTimeout

log = logging.getLogger("fast")

SHRINK_GRACE = 5.0
"""Seconds added to the engine's timeout for every survivor to reach the shrink (each finishes its step first)."""


class _Group:
    """The communicators of one group, revoked together when a rank of it is lost."""

    def __init__(self, comm) -> None:
        self.comms = [comm]
        self.lost = False
        self.reason = ""
        self._lock = threading.Lock()

    def add(self, comm) -> None:
        with self._lock:
            self.comms.append(comm)
        if self.lost:  # made while the group was being revoked: it is no better
            _revoke(comm)

    def revoke(self, reason: str) -> None:
        """Revoke every communicator of the group (once): every survivor's calls on them fail from now on."""
        with self._lock:
            if self.lost:
                return
            self.lost, self.reason = True, reason
            comms = list(self.comms)
        for comm in comms:
            _revoke(comm)


def _revoke(comm) -> None:
    try:
        comm.Revoke()
    except Exception:  # noqa: BLE001 - a communicator already revoked or freed by the library
        pass


class FaultTolerantMPIEngine(MPIEngine, FaultTolerant):
    """MPIEngine whose job survives a dead rank: ``PeerLost`` on every survivor, then ``shrink``."""

    name = "mpi-ft"

    def __init__(
        self,
        comm=None,
        timeout: float = DEFAULT_TIMEOUT,
        max_restarts: int = 0,
        max_ranks: int = 0,
        *,
        _group: _Group | None = None,
        _world: tuple[int, ...] | None = None,
    ) -> None:
        MPI = _mpi()
        check_ulfm(MPI)
        self.restarts_left = max_restarts
        """Lost ranks ``grow`` may still replace with new processes (``fast run --max-restarts``)."""
        self.joined: tuple[int, ...] = ()
        """On a process spawned to replace lost ranks, until its Worker has joined: the launch numbers of the
        group's newcomers (it is one of them). Empty otherwise."""
        self.max_ranks = max_ranks
        world = _world
        self.launched = 0
        """Launch numbers given so far (the job's start, and every ``grow`` that added ranks): the next new one."""
        if comm is None:
            MPI.COMM_WORLD.Set_errhandler(MPI.ERRORS_RETURN)  # duplicates inherit it
            parent = MPI.Comm.Get_parent()
            if parent != MPI.COMM_NULL:  # spawned by ``grow``: join the group
                comm, world, self.joined, self.restarts_left, self.launched = _join_survivors(MPI, parent)
            else:
                comm = MPI.COMM_WORLD.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        super().__init__(comm, timeout)
        self._group = _group if _group is not None else _Group(comm)
        self._world = world if world is not None else tuple(range(self.size))
        self.launched = max(self.launched, max(self._world) + 1)
        self._scratch: dict[tuple[int, str], np.ndarray] = {}

    @property
    def world_ranks(self) -> tuple[int, ...]:
        return self._world

    # failures ------------------------------------------------------------------------------------------------
    def _failure(self, exc: Exception, text: str) -> Exception:
        MPI = self._MPI
        lost_classes = {
            MPI.ERR_PROC_FAILED,
            getattr(MPI, "ERR_PROC_FAILED_PENDING", MPI.ERR_PROC_FAILED),
            MPI.ERR_REVOKED,
        }
        if exc.Get_error_class() not in lost_classes:
            return super()._failure(exc, text)
        if exc.Get_error_class() == MPI.ERR_REVOKED:  # not a sign that this call's peer died
            text = text.split(" failed in MPI")[0] + " was stopped: a rank revoked the group (a rank lost, or workers "
            text += "joining)"
        self._group.revoke(text)
        return PeerLost(f"{text}; the survivors shrink the group and go on")

    def leave(self, error: BaseException) -> NoReturn:
        """SIGKILL to this process: ULFM declares it failed and the others shrink, as after kill -9 (an exit with
        an error would make ``fast run`` stop the whole job: a rank's own error is never survived)."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise error  # not reached

    def revoke(self, reason: str) -> None:
        self._group.revoke(f"rank {self.rank}: {reason}")

    def check_alive(self) -> None:
        if self._group.lost:
            raise PeerLost(f"rank {self.rank}: the group was revoked ({self._group.reason})")

    def dup(self, timeout: float | None = None) -> FaultTolerantMPIEngine:
        self.check_alive()
        comm = self._post(self.comm.Dup)
        self._group.add(comm)
        return FaultTolerantMPIEngine(
            comm, self.timeout if timeout is None else timeout, _group=self._group, _world=self._world
        )

    def split(self, color: int) -> FaultTolerantMPIEngine:
        raise NotImplementedError(
            f"rank {self.rank}: the fault-tolerant MPI engine cannot split into groups yet (a lost rank would leave "
            "a pipeline stage without its replica group); run pipelines without --fault-tolerant"
        )

    def _kind_comm(self, kind: str | None, what: str):
        fresh = kind is not None and self._kind_comms is None
        comm, what = super()._kind_comm(kind, what)
        if fresh:
            for made in self._kind_comms.values():
                self._group.add(made)
        return comm, what

    # collectives that leave the buffer intact when they fail --------------------------------------------------
    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        self.check_alive()
        scratch = self._scratch_for(buf)
        np.copyto(scratch, buf)
        super().allreduce(scratch, op, kind)
        np.copyto(buf, scratch)

    def iallreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> Request:
        """Posted on ``buf`` itself (no scratch): a lost rank leaves ``buf`` undefined, so its owner drops it."""
        self.check_alive()
        return super().iallreduce(buf, op, kind)

    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        self.check_alive()
        if self.rank == root:
            super().broadcast(buf, root, kind)
            return
        scratch = self._scratch_for(buf)
        super().broadcast(scratch, root, kind)
        np.copyto(buf, scratch)

    def _scratch_for(self, buf: np.ndarray) -> np.ndarray:
        key = (buf.size, buf.dtype.str)
        scratch = self._scratch.get(key)
        if scratch is None:
            self._scratch = {key: np.empty(buf.size, dtype=buf.dtype)}  # one at a time: the last size used
            scratch = self._scratch[key]
        return scratch.reshape(buf.shape)

    # the group shrinks to the survivors -----------------------------------------------------------------------
    def shrink(self) -> tuple[int, ...]:
        MPI = self._MPI
        self._group.revoke(f"rank {self.rank} shrinks the group")
        shrunk = self._shrink_in_time()
        shrunk.Set_errhandler(MPI.ERRORS_RETURN)
        old, new = self.comm.Get_group(), shrunk.Get_group()
        kept = MPI.Group.Translate_ranks(new, list(range(new.Get_size())), old)
        old.Free()
        new.Free()
        lost = tuple(self._world[r] for r in range(self.size) if r not in set(kept))
        self._world = tuple(self._world[r] for r in kept)
        self.comm = shrunk
        self.rank, self.size = shrunk.Get_rank(), shrunk.Get_size()
        self._group = _Group(shrunk)
        self._kind_comms = None
        self._collectives = 0
        self.changes += 1
        return lost

    def _shrink_in_time(self):
        """MPI_Comm_shrink, which has no timeout of its own, run beside a deadline: a survivor that never comes
        (stuck, or frozen by SIGSTOP: ULFM declares only dead processes failed) ends the job with a PeerTimeout."""
        return _in_time(self.comm.Shrink, self.timeout + SHRINK_GRACE, f"rank {self.rank}: shrinking the group")

    def grow(self, replacing: tuple[int, ...], adding: int = 0) -> tuple[int, ...]:
        """Collective over the group after ``shrink``: start one new process per launch number in ``replacing``
        (while restarts are left) and ``adding`` more under new launch numbers (MPI_Comm_spawn of the command line
        that started this one, in its folder), merge them into the group and number the group by launch number
        again, so a replacement takes a lost rank's place (its number, its shard of the data, its place in the
        topology) and an added worker the next number. Returns the launch numbers taken (none if spawning failed:
        the group then goes on as it is, and it is logged)."""
        MPI = self._MPI
        replacing = tuple(replacing[: self.restarts_left])
        numbers = replacing + tuple(range(self.launched, self.launched + adding))
        if not numbers:
            return ()
        info = MPI.Info.Create()
        info.Set("wdir", os.getcwd())
        commands = replacement_commands(numbers)
        try:
            inter = _in_time(
                lambda: self.comm.Spawn_multiple(
                    [c[0] for c in commands],
                    args=[c[1:] for c in commands],
                    maxprocs=[1] * len(commands),
                    info=[info] * len(commands),
                    root=0,
                ),
                self.timeout + SHRINK_GRACE,
                f"rank {self.rank}: starting {len(numbers)} new process(es)",
            )
        except FastError as exc:
            log.warning("%s; the group goes on without them", exc)
            return ()
        finally:
            info.Free()
        inter.Set_errhandler(MPI.ERRORS_RETURN)
        merged = _in_time(
            lambda: inter.Merge(high=False), self.timeout + SHRINK_GRACE, f"rank {self.rank}: taking in new processes"
        )
        self.restarts_left -= len(replacing)
        self.launched += adding
        header = np.array(
            [len(self._world), len(numbers), self.restarts_left, self.launched, *self._world, *numbers], np.int64
        )
        self.comm, self._world = _renumber(MPI, merged, header)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._group = _Group(self.comm)
        self._kind_comms = None
        self._collectives = 0
        self.changes += 1
        return numbers


def replacement_commands(replacing: tuple[int, ...]) -> list[list[str]]:
    """The command line of each new process, in ``replacing``'s order: this one's (``sys.orig_argv``), below a guard
    of its own told the rank it takes over when this one runs below ``fast run``'s guard (``guard_command``)."""
    guard = guard_command()
    if guard is None:
        return [list(sys.orig_argv) for _ in replacing]
    return [[*guard[:3], f"--rank={number}", *guard[3:], *sys.orig_argv] for number in replacing]


HEADER = 4
"""What ``grow``'s header holds before the launch numbers: members, newcomers, restarts left, numbers given."""


def _renumber(MPI, merged, header: np.ndarray | None) -> tuple[object, tuple[int, ...]]:
    """Rank 0 of ``merged`` (survivors first, newcomers after) tells everyone the survivors' and newcomers' launch
    numbers; the group is split again ordered by launch number. Returns the new communicator and its numbers."""
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    length = np.array([0 if header is None else len(header)], np.int64)
    merged.Bcast(length, root=0)
    if header is None:
        header = np.empty(int(length[0]), np.int64)
    merged.Bcast(header, root=0)
    survivors, newcomers = int(header[0]), int(header[1])
    numbers = [int(n) for n in header[HEADER : HEADER + survivors + newcomers]]
    mine = numbers[merged.Get_rank()]
    comm = merged.Split(0, mine)
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm, tuple(sorted(numbers))


def _join_survivors(MPI, parent) -> tuple[object, tuple[int, ...], tuple[int, ...], int, int]:
    """A spawned process joins the group that started it (its ``grow``): its communicator, the group's launch
    numbers, the newcomers' numbers, the restarts the job has left and the launch numbers given so far."""
    parent.Set_errhandler(MPI.ERRORS_RETURN)
    merged = parent.Merge(high=True)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    length = np.zeros(1, np.int64)
    merged.Bcast(length, root=0)
    header = np.empty(int(length[0]), np.int64)
    merged.Bcast(header, root=0)
    survivors, newcomers, restarts, launched = (int(v) for v in header[:HEADER])
    numbers = [int(n) for n in header[HEADER : HEADER + survivors + newcomers]]
    comm = merged.Split(0, numbers[merged.Get_rank()])
    return comm, tuple(sorted(numbers)), tuple(numbers[survivors:]), restarts, launched


def _in_time(call, seconds: float, what: str):
    """Run a blocking MPI call that has no timeout of its own beside a deadline: PeerTimeout after ``seconds``
    (the call's thread is left behind; the job is ending)."""
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            result["error"] = exc

    thread = threading.Thread(target=run, name="fast-mpi-call", daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise PeerTimeout(
            f"{what}: waited {time.monotonic() - started:.0f} s for the other survivors; a survivor is stuck or "
            "frozen (a frozen process is not dead to MPI)"
        )
    if "error" in result:
        exc = result["error"]
        raise FastError(f"{what}: MPI failed ({_error_text(exc)})") from exc
    return result["value"]


def check_ulfm(MPI) -> None:
    """Refuse, on every rank, an MPI library that cannot survive a dead process."""
    version = MPI.Get_library_version()
    if "Open MPI" not in version or not hasattr(MPI.Comm, "Shrink"):
        raise FastError(
            "the fault-tolerant engine needs Open MPI with ULFM (run by `fast run --fault-tolerant`, which passes "
            f"`--with-ft ulfm`), but mpi4py loaded {version.splitlines()[0]!r}; pip install 'fast-training[mpi-ft]'"
        )
