"""A rank's uncaught exception under ``fast run``: recorded for the launcher's closing line, and shown once.

When one error ends a job, the user should read it once, with its rank, and not the same story again from every
other rank. So each rank (``install``, from ``fast_core.init()`` when it runs under ``fast run``) records its
uncaught exception in ``RUN_DIR/errors/rank<r>.json`` (type, first line of the message, the traceback, the wall
clock), which ``fast run`` reads to name the cause in its closing line and run.json. An error that only follows
another rank's (a ``PeerTimeout``, ``PeerFailed`` or ``PeerLost``: it names the peer it waited for or lost) is
shown as one line instead of a traceback, and so is an error another rank already shows (the same type and message,
as a bad option refused on every rank); the traceback stays in the record.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType

from fast_core.errors import PeerFailed, PeerTimeout

ERRORS = "errors"
"""The run folder's subfolder of the ranks' error records."""

CONSEQUENCES = (PeerTimeout, PeerFailed)
"""Errors that name a peer the rank waited for or lost: the cause is that peer's (PeerLost is a PeerFailed)."""

_installed: Path | None = None  # the run folder, once installed


def install(run_dir: Path, rank: int) -> None:
    """Record this process's uncaught exception as rank ``rank``'s, and show a consequence in one line; once."""
    global _installed
    if _installed is not None:
        return
    _installed = Path(run_dir)
    shown = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        consequence = isinstance(error, CONSEQUENCES)
        record(run_dir, rank, error, "".join(traceback.format_exception(kind, error, trace)), consequence)
        if consequence:
            print(
                f"rank {rank} stopped: {describe(error)} (it waited for or lost another rank: fast run's closing "
                "line names the cause; the traceback is in the run folder's errors/)",
                file=sys.stderr,
                flush=True,
            )
            return
        teller = first_to_tell(run_dir, rank, error)
        if teller == rank:
            shown(kind, error, trace)
        else:
            print(
                f"rank {rank} stopped with the error rank {teller} shows: {describe(error)} (the traceback is in the "
                f"run folder's errors/rank{rank}.json)",
                file=sys.stderr,
                flush=True,
            )

    sys.excepthook = hook


def record_leaving(rank: int, error: BaseException) -> None:
    """Record why launch rank ``rank`` leaves a fault-tolerant job on purpose (its own numbers turned NaN): fast run
    names it among the lost ranks, and never takes it for the error that ended a job (``cause_of``)."""
    if _installed is not None:
        record(_installed, rank, error, "".join(traceback.format_exception(error)), consequence=False, left=True)


def describe(error: BaseException) -> str:
    """``Type: first line of the message``."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def first_to_tell(run_dir: Path, rank: int, error: BaseException) -> int:
    """The rank that shows ``error``'s traceback: the first of the ranks raising the same error (type and message,
    as a bad option is refused on every rank) to claim it in the run folder, else ``rank`` itself (a folder we
    cannot write, or not shared between hosts, and each rank shows its own)."""
    digest = hashlib.sha256(describe(error).encode()).hexdigest()[:16]
    claim = Path(run_dir) / ERRORS / f".shown-{digest}"
    try:
        claim.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        time.sleep(0.05)  # the claimant writes its rank right after creating the file
        text = claim.read_text().strip() if claim.is_file() else ""
        return int(text) if text.isdigit() else rank
    except OSError:
        return rank
    with os.fdopen(descriptor, "w") as told:
        told.write(str(rank))
    return rank


def record(
    run_dir: Path, rank: int, error: BaseException, trace: str, consequence: bool, left: bool = False
) -> None:
    """Write rank ``rank``'s error record (whole, then renamed into place); a folder we cannot write is no error.
    ``consequence``: the error only follows another rank's (a ``CONSEQUENCES``). ``left``: the rank left a
    fault-tolerant job over it, which went on (``record_leaving``)."""
    ended = {
        "rank": rank,
        "pid": os.getpid(),
        "error": describe(error),
        "consequence": consequence,
        "left": left,
        "peers": [int(r) for r in getattr(error, "ranks", ()) or ()],  # whom a consequence waited for or lost
        "wall": time.time(),
        "traceback": trace,
    }
    folder = Path(run_dir) / ERRORS
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".rank{rank}.json.{os.getpid()}"
        partial.write_text(json.dumps(ended) + "\n")  # a rank that left keeps one per process (replacements leave too)
        partial.replace(folder / (f"rank{rank}.{os.getpid()}.json" if left else f"rank{rank}.json"))
    except OSError:
        pass


def read_errors(run_dir: Path) -> list[dict]:
    """The ranks' error records, earliest first; unreadable ones (a rank killed mid-write) are skipped."""
    found = []
    for path in (Path(run_dir) / ERRORS).glob("rank*.json"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda e: e.get("wall", float("inf")))


def cause_of(errors: list[dict]) -> dict | None:
    """The error that ended the job: the earliest that is not a consequence of another's, else the earliest."""
    ending = [e for e in errors if not e.get("left")] or errors  # a rank that left was survived
    return next((e for e in ending if not e.get("consequence")), ending[0] if ending else None)
