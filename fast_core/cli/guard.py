"""The parent of one rank under ``fast run``: ``python guard.py EXITS -- python -m mpi4py ...``, started by MPICH's
or Open MPI's mpiexec in the rank's place; it says how the rank ended if it ended badly.

With ``--lines=prefixed`` (``fast run``'s default) the guard also relays the rank's stdout and stderr, each to its
own stream, in whole lines with ``[r] `` in front, as ``mpiexec -prepend-rank`` does but under MPICH and Open MPI
alike; ``--lines=whole`` (``fast run --no-rank-prefix``) relays them without it. One write per batch of whole
lines, so lines of different ranks never meet mid-line on the terminal (a ``\r`` ends a line too, so a bar's
redraws pass as they come); ``--redraws=rank0`` passes only rank 0's redraws and ``--redraws=none`` nobody's (a bar's
last draw, ended by a newline, always passes), so that ranks' bars neither take turns on one line nor pile up in a
log. The guard tells the rank how it was started (``FAST_GUARD``, its own command line up
to ``--``), so that a replacement the survivors spawn (``--max-restarts``) runs under a guard too, given the rank
it takes over with ``--rank=R``: its lines carry that rank, and a bad ending of its own is recorded beside the lost
process's (``EXITS/rank<r>.<pid>.json``).

When a rank dies, MPICH's mpiexec kills the others at once and prints a PID that is often another rank's (the first
it stopped), and no rank number; Open MPI's names the rank but not its step, and under ULFM (``--fault-tolerant``)
the others may go on without it and mpiexec end with status 0. The rank itself cannot report a SIGKILL; its parent
can, with no race: it waits for the rank and, on a signal or a nonzero status, writes ``EXITS/rank<r>.json`` (rank,
pid, host, signal, status, wall-clock) before it ends the same way, so mpiexec sees and does what it would have
without it. The launcher reads the earliest such file to name the lost rank (every one, under ULFM). Run as a
plain script (stdlib only, nothing of fast_core imported), so it costs a bare interpreter's start (isolated, -I:
nothing next to it can shadow the standard library).
"""

from __future__ import annotations

import json
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
"""Where an MPI launcher tells a process its rank (MPICH's hydra, Open MPI, PMIx, srun: last, since under mpiexec in
an allocation every rank inherits its batch step's SLURM_PROCID=0)."""


LINE = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")
"""One whole line with its end: a newline, or a carriage return (a progress bar's redraw)."""


def launch_rank() -> str | None:
    """This process's rank as its MPI launcher tells it, or None outside one."""
    return next((os.environ[v] for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()), None)


def relay_lines(source: int, emit: Callable[[bytes], None]) -> None:
    """Read ``source`` (a file descriptor) to its end and hand ``emit`` whole lines only, a chunk's lines at once; a
    last line without its end is handed over at the end."""
    pending = b""
    while chunk := os.read(source, 65536):
        pending += chunk
        cut = 0
        for match in LINE.finditer(pending):
            cut = match.end()
        if cut:
            emit(pending[:cut])
            pending = pending[cut:]
    if pending:
        emit(pending)


def without_redraws(lines: bytes) -> bytes:
    """``lines`` less its redraws: a line ended by a lone ``\\r`` is a progress bar drawn again in place (tqdm,
    Keras), which in a log or beside other ranks' lines only piles up; the bar's last draw ends with a newline and
    stays."""
    whole = LINE.findall(lines)
    rest = lines[sum(map(len, whole)) :]
    return b"".join(line for line in whole if not line.endswith(b"\r")) + rest


def prefixed(prefix: bytes, lines: bytes) -> bytes:
    """``prefix`` in front of every line of ``lines`` (whole lines, maybe a last one without its end)."""
    whole = LINE.findall(lines)
    rest = lines[sum(map(len, whole)) :]
    return b"".join(prefix + line for line in [*whole, rest] if line)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is out (a pipe may take fewer at once)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _relay(source: int, target: int, prefix: bytes, redraws: bool) -> threading.Thread:
    """A thread copying the rank's ``source`` to our ``target``, ``prefix`` before each line; a bar's redraws only
    if ``redraws``."""

    def emit(lines: bytes) -> None:
        try:
            write_all(target, prefixed(prefix, lines if redraws else without_redraws(lines)))
        except OSError:  # our reader is gone (mpiexec stopping): the rank's output has nowhere to go
            pass

    thread = threading.Thread(target=relay_lines, args=(source, emit), daemon=True)
    thread.start()
    return thread


PR_SET_PDEATHSIG = 1
"""Linux's prctl option: the signal a process gets when its parent dies."""


def dying_with_us() -> Callable[[], None] | None:
    """What the rank runs before its program (Linux): be killed when this guard dies. A guard killed on its own (a
    kill -9 of the wrong pid) would otherwise leave its rank running, unseen by mpiexec, whose child the guard
    was: the guard's loss is the rank's, which the survivors recover from like any other. None elsewhere."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: nothing is imported after the fork
    except (OSError, AttributeError):
        return None
    guard = os.getpid()

    def in_the_rank() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != guard:  # the guard died before the line above: nobody would tell us
            os.kill(os.getpid(), signal.SIGKILL)

    return in_the_rank


def _ignore(_signum: int, _frame: object) -> None:
    """mpiexec signals each rank's whole process group, so the rank gets Ctrl-C or SIGTERM itself; the guard stays
    to see how it ends. (A handler, not SIG_IGN: a handled signal is reset to default in the rank at exec.)"""


def record(exits: Path, pid: int, status: int, given: str | None = None, frozen: float | None = None) -> None:
    """Write how the rank ended, if the launcher told us our rank (written whole, then renamed into place).
    ``given``: the rank a replacement took over (``--max-restarts``), recorded beside the lost process's ending;
    ``frozen``: the seconds without a heartbeat after which this guard killed it."""
    rank = given or launch_rank()
    if rank is None:
        return
    ended = {
        "rank": int(rank),
        "pid": pid,
        "host": socket.gethostname(),
        "signal": _name(-status) if status < 0 else None,
        "status": status,
        "wall": time.time(),
    }
    if frozen is not None:
        ended["frozen"] = frozen
    exits.mkdir(parents=True, exist_ok=True)
    partial = exits / f".rank{rank}.json.{os.getpid()}"
    partial.write_text(json.dumps(ended) + "\n")
    partial.replace(exits / (f"rank{rank}.json" if given is None else f"rank{rank}.{pid}.json"))


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def end_like(status: int) -> None:
    """Exit as the rank did: with its status, or killed by its signal (no core file of the guard's own)."""
    if status >= 0:
        sys.exit(status)
    signum = -status
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)  # a signal whose default is to go on (e.g. SIGCHLD) ends the guard anyway


LINES_OPTIONS = {"--lines=prefixed": True, "--lines=whole": False}
"""The guard's option when it relays the rank's output in whole lines: with ``[r] `` in front or not."""
REDRAWS = ("all", "rank0", "none")
"""``--redraws=``: whose progress-bar redraws the relay passes on (every rank's, rank 0's, nobody's); default all."""
USAGE = (
    "usage: guard.py [--lines=prefixed|--lines=whole] [--redraws=all|rank0|none] [--freeze=SECONDS] [--rank=R] "
    "EXITS -- command [args...]"
)
HEARTBEAT_VARIABLE = "FAST_HEARTBEAT_FD"
"""Where the guard tells the rank the pipe to beat on (``fast_core.runtime.heartbeat``), under ``--freeze``."""


class Options(NamedTuple):
    prefix: bool | None
    """Relay the rank's output in lines: with the prefix (True), without (False), or not at all (None)."""
    redraws: str
    """Whose progress-bar redraws pass (``REDRAWS``)."""
    rank: str | None
    """The rank given with ``--rank`` (a replacement's), else None: the launcher's."""
    freeze: float
    """Seconds without a heartbeat after which the rank is taken for frozen and killed; 0: never."""
    exits: Path
    command: list[str]


def parse(argv: list[str]) -> Options:
    """The guard's options, EXITS and the rank's command line."""
    prefix, redraws, rank, freeze, args = None, "all", None, 0.0, argv[1:]
    while args and args[0].startswith("--") and args[0] != "--":
        option = args.pop(0)
        name, _, value = option.partition("=")
        if option in LINES_OPTIONS:
            prefix = LINES_OPTIONS[option]
        elif name == "--redraws" and value in REDRAWS:
            redraws = value
        elif name == "--rank" and value.isdigit():
            rank = value
        elif name == "--freeze" and _seconds(value) is not None:
            freeze = _seconds(value)
        else:
            sys.exit(f"guard.py: unknown option {option}; {USAGE}")
    if len(args) < 3 or args[1] != "--":
        sys.exit(USAGE)
    return Options(prefix, redraws, rank, freeze, Path(args[0]), args[2:])


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None


def _watch_heartbeat(beats: int, rank: subprocess.Popen, freeze: float, frozen: threading.Event) -> threading.Thread:
    """A thread reading the rank's heartbeat pipe (``beats``): once the rank has beaten, ``freeze`` seconds without
    a beat (stopped with SIGSTOP, hung with the interpreter held) make it kill the rank and set ``frozen``. Before
    the first beat (the rank still importing) nothing is expected; the pipe's end (the rank gone) ends the watch."""

    def watch() -> None:
        beaten = False
        while True:
            ready, _, _ = select.select([beats], [], [], freeze if beaten else None)
            if not ready:  # no beat within the bound
                frozen.set()
                try:
                    rank.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            if not os.read(beats, 4096):
                return
            beaten = True

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> None:
    options = parse(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _ignore)
    pipes = {} if options.prefix is None else {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    itself = [sys.executable, "-I", str(Path(__file__).resolve()), *argv[1 : argv.index("--") + 1]]
    env = dict(os.environ, FAST_GUARD=json.dumps([a for a in itself if not a.startswith("--rank=")]))
    beats = beating = None
    if options.freeze > 0:
        beats, beating = os.pipe()
        os.set_inheritable(beating, True)  # the rank's, across its exec
        env[HEARTBEAT_VARIABLE] = str(beating)
    # MPI's own descriptors (PMI_FD) must reach the rank
    rank = subprocess.Popen(options.command, close_fds=False, env=env, preexec_fn=dying_with_us(), **pipes)
    frozen = threading.Event()
    if beats is not None:
        os.close(beating)  # the rank holds the only writing end: its death ends the pipe
        _watch_heartbeat(beats, rank, options.freeze, frozen)
    relays = []
    if options.prefix is not None:
        number = options.rank or launch_rank()
        tag = f"[{number or '?'}] ".encode() if options.prefix else b""
        shown = options.redraws == "all" or (options.redraws == "rank0" and number == "0")
        relays = [_relay(rank.stdout.fileno(), 1, tag, shown), _relay(rank.stderr.fileno(), 2, tag, shown)]
    status = rank.wait()
    for relay in relays:  # a child the rank left behind may hold the pipe open: wait a little, not for it
        relay.join(timeout=2)
    if status != 0:
        try:
            record(options.exits, rank.pid, status, options.rank, options.freeze if frozen.is_set() else None)
        except OSError as exc:  # never in the way of the ending itself
            print(f"fast: could not record how rank ended: {exc}", file=sys.stderr)
    end_like(status)


if __name__ == "__main__":
    main(sys.argv)
