"""How a ``fast run`` job ended, judged, named and recorded once it has: from mpiexec's status, the guards' records of
ranks that ended badly (``EXITS``) and the ranks' own records in the run folder, the status ``fast run`` returns, what
run.json adds (the lost rank and its step; under ``--fault-tolerant`` every rank lost, whether the others survived
it, the ranks new processes took over) and the closing lines said. ``fast_core.cli.run`` launches the job and calls
``job_ending`` when it is over.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fast_core.cli.launch import EXITS, Job, bad_exits, exit_status, first_exit
from fast_core.observers.runlog import read_run
from fast_core.runtime.joins import JOINS
from fast_core.runtime.startup import STARTING
from fast_core.runtime.uncaught import ERRORS, read_errors


def clear_endings(run_dir: Path) -> None:
    """Forget a reused run folder's (or the launch before's) guard records, errors and start marks."""
    for earlier in (EXITS, ERRORS, STARTING, JOINS):
        shutil.rmtree(run_dir / earlier, ignore_errors=True)


def _process_records(records: list[dict], pid: int | None) -> list[dict]:
    """The records one process wrote to its rank's log: a replacement (``--max-restarts``) appends its own after a
    "start" record of its own; the launched process's come first."""
    segments: list[list[dict]] = []
    for record in records:
        if record.get("kind") == "start" or not segments:
            segments.append([])
        segments[-1].append(record)
    mine = [s for s in segments if s[0].get("kind") == "start" and s[0].get("pid") == pid]
    return mine[0] if mine else (segments[0] if segments else [])


def lost_rank(exits: Path, run_dir: Path) -> dict | None:
    """The first rank that ended badly (its guard's record), with the step of its last record in the run folder
    and how long before its end that record was written; None if no guard recorded one."""
    lost = first_exit(exits)
    return None if lost is None else with_step(lost, run_dir)


def with_step(lost: dict, run_dir: Path) -> dict:
    """A guard's record of a lost rank, with the step of the rank's last record in the run folder and how long
    before its end that record was written (when it wrote any)."""
    lost = dict(lost)
    records = _process_records(read_run(run_dir).get(lost["rank"], []), lost.get("pid"))
    start = next((r for r in records if r.get("kind") == "start"), None)
    last = next((r for r in reversed(records) if "step" in r), None)
    if last is not None:
        lost["step"] = last["step"]
        if start is not None and "wall_start" in start:
            lost["record_age"] = round(lost["wall"] - start["wall_start"] - last["time"], 3)
    return lost


def unrecorded_losses(run_dir: Path, recorded: list[dict]) -> list[dict]:
    """Ranks the survivors lost (their "membership" records) that no guard's record names: a guard killed itself
    takes its rank along (``guard.dying_with_us``) and writes nothing. The pid and host come from the lost
    process's own "start" record; "wall" is when the first survivor learned of the loss."""
    known = {e["rank"] for e in recorded}
    records = read_run(run_dir)
    detected: dict[int, float] = {}
    for record in (r for rank_records in records.values() for r in rank_records if r["kind"] == "membership"):
        for number in str(record.get("lost", "")).split(","):
            if number.strip().isdigit() and int(number) not in known:
                wall = float(record.get("detected_at") or 0.0)
                detected[int(number)] = min(wall, detected.get(int(number), wall))
    found = []
    for rank, wall in sorted(detected.items()):
        start = next((r for r in records.get(rank, []) if r.get("kind") == "start"), {})
        found.append(
            {"rank": rank, "pid": start.get("pid"), "host": start.get("host"), "signal": None, "status": None,
             "wall": wall, "unrecorded": True}
        )
    return found


def job_ending(status: int, job: Job, run_dir: Path) -> tuple[int, dict, list[str]]:
    """How the job ended, from mpiexec's status and the guards' records: the status ``fast run`` returns, what
    run.json adds ("lost": the rank whose loss ended the job; under --fault-tolerant also "lost_ranks", every rank
    lost, and "survived" when one was), and the lines to say. A stop asked for (Ctrl-C, SIGTERM) loses no rank."""
    exits = run_dir / EXITS
    if job.stopped_by:
        return status, {}, []
    if not job.fault_tolerant:
        lost = lost_rank(exits, run_dir) if status != 0 else None
        return status, ({"lost": lost} if lost else {}), ([lost_text(lost, job.kind)] if lost else [])
    if job.unstartable is not None:  # the others waited in MPI_Init for it: fast run stopped them
        cause = with_step(job.unstartable, run_dir)
        line = f"{rank_text(cause)} before its MPI start finished: MPI_Init waits for every process, so the others "
        line += "could not start; fast run stopped them (with --max-restarts K it starts the job again)"
        return status, {"lost": cause, "lost_ranks": [cause], "survived": False, "before_mpi_start": True}, [line]
    recorded = bad_exits(exits)
    endings = [with_step(e, run_dir) for e in recorded + unrecorded_losses(run_dir, recorded)]
    endings.sort(key=lambda e: e["wall"])
    left = {e.get("pid"): e["error"] for e in read_errors(run_dir) if e.get("left")}
    for ending in endings:  # a process that left on purpose (its numbers turned NaN) ended itself with SIGKILL
        if ending.get("pid") in left:
            ending["left"] = left[ending["pid"]]
    aborted = job.aborted or next((e for e in endings if not e.get("signal") and (e.get("status") or 0) > 0), None)
    if aborted is not None:  # a rank's own error is never survived (the launcher stops the others: ULFM's Abort won't)
        cause = with_step(aborted, run_dir)
        before = [e for e in endings if e["wall"] < cause["wall"]]
        line = lost_text(cause, "launcher" if job.aborted is not None else job.kind)
        return status or cause["status"], {"lost": cause, "lost_ranks": [*before, cause], "survived": False}, [line]
    replaced, finished = _replacements(run_dir)
    if status != 0 and not endings and finished and joined_ranks(run_dir):
        # Open MPI's launcher ends with status 1 ("LAUNCHER JOB OBJECT NOT FOUND") once ranks spawned workers that
        # asked to join; every guard recorded a clean exit and the job closed
        return 0, {"lost_ranks": [], "mpiexec_status": status}, []
    killed = all(e.get("signal") or e.get("unrecorded") for e in endings)
    if status != 0 and endings and replaced and finished and killed:
        # Open MPI's launcher reports a killed rank's status once it spawned replacements; the job finished
        ending = {"lost_ranks": endings, "survived": True, "replaced": replaced, "mpiexec_status": status}
        return 0, ending, [survived_text(endings, job.workers, replaced)]
    if status != 0:
        cause = endings[0] if endings else None
        ending = {"lost_ranks": endings, **({"lost": cause, "survived": False} if cause else {})}
        return status, ending, [lost_text(cause, job.kind)] if cause else []
    if not endings:
        return status, {"lost_ranks": []}, []
    every_lost = len({e["rank"] for e in endings}) >= job.workers and not (replaced and finished)
    if every_lost:  # mpiexec says 0 under ULFM even then
        first = endings[0]
        status = exit_status(first["status"] or 0) or 1  # None: a loss no guard recorded
        line = f"every one of the {job.workers} ranks was lost: " + "; ".join(rank_text(e) for e in endings)
        return status, {"lost": first, "lost_ranks": endings, "survived": False}, [line]
    ending = {"lost_ranks": endings, "survived": True, "replaced": replaced}
    return status, ending, [survived_text(endings, job.workers, replaced)]


def _replacements(run_dir: Path) -> tuple[list[int], bool]:
    """The launch numbers new processes took over (the ranks' "membership" records, ``--max-restarts``), and
    whether any rank closed its worker (a "close" record)."""
    records = read_run(run_dir)
    finished = any(record["kind"] == "close" for rank_records in records.values() for record in rank_records)
    return _membership_numbers(records, "replaced"), finished


def joined_ranks(run_dir: Path) -> list[int]:
    """The launch numbers of workers that joined the job while it ran (the ranks' "membership" records, ``fast run
    --join``)."""
    return _membership_numbers(read_run(run_dir), "joined")


def _membership_numbers(records: dict[int, list[dict]], key: str) -> list[int]:
    """Every launch number listed under ``key`` ("replaced", "joined") in any rank's "membership" records."""
    return sorted(
        {
            int(number)
            for rank_records in records.values()
            for record in rank_records
            if record["kind"] == "membership"
            for number in str(record.get(key, "")).split(",")
            if number.strip().isdigit()
        }
    )


def error_text(cause: dict, errors: list[dict]) -> str:
    """One line: the rank whose error ended the job and the error, then the ranks that stopped after it."""
    after = [e for e in errors if e is not cause]
    if cause.get("consequence"):  # no rank raised an error of its own: one hung, froze or died
        peers = sorted({p for e in errors for p in e.get("peers", [])})
        return (
            f"rank(s) {sorted(e['rank'] for e in errors)} stopped waiting for or losing rank(s) {peers}, which raised "
            f"no error of its own (stuck, frozen or killed); rank {cause['rank']} first: {cause['error']}"
        )
    text = f"rank {cause['rank']} raised {cause['error']}"
    if after:
        kinds = sorted({e["error"].split(":")[0] for e in after})
        text += f"; rank(s) {sorted(e['rank'] for e in after)} stopped after it ({', '.join(kinds)})"
    return text + " (tracebacks in the run folder's errors/)"


def rank_text(lost: dict) -> str:
    """A lost rank, how it ended and the step it was at."""
    how = f"was killed by {lost['signal']}" if lost.get("signal") else f"exited with status {lost['status']}"
    if lost.get("left"):
        how = f"left the group ({lost['left']})"
    elif lost.get("frozen") is not None:
        how = f"froze (no heartbeat for {lost['frozen']:g} s) and was killed by its guard"
    elif lost.get("unrecorded"):
        how = "was lost with no record of how it ended (its guard, the process fast run starts above it, died too)"
    where = ""
    if "step" in lost:
        age = lost.get("record_age")
        written = f", written {age:.2f} s before" if age is not None else ""
        where = f" at step {lost['step']} or a little after (its last record{written})"
    return f"rank {lost['rank']} (pid {lost['pid']}, host {lost['host']}) {how}{where}"


STOPPED_BY = {
    "hydra": "mpiexec stopped the other ranks (a PID in MPICH's banner above may be another rank's)",
    "openmpi": "mpiexec stopped the other ranks (the PID in Open MPI's banner above is the rank's guard's)",
    "srun": "srun stopped the other ranks (--kill-on-bad-exit)",
    "launcher": "fast run stopped the other ranks (under ULFM, Open MPI's MPI_Abort does not)",
}


def lost_text(lost: dict, kind: str = "hydra") -> str:
    """One line naming the lost rank, how it ended and the step it was at, and who stopped the others (``kind``:
    the mpiexec's flavour, or "launcher" when fast run did)."""
    return f"{rank_text(lost)}; {STOPPED_BY.get(kind, 'mpiexec stopped the other ranks')}"


def survived_text(lost: list[dict], workers: int, replaced: list[int] | None = None) -> str:
    """One line naming the ranks lost in a job the others finished (and the ranks new processes took over)."""
    if replaced:
        names = "; ".join(rank_text(e) for e in lost)
        return f"{names}; new processes took over rank(s) {replaced} and the job finished"
    left = workers - len({e["rank"] for e in lost})
    others = "the other rank" if left == 1 else f"the {left} other ranks"
    them = "it" if len(lost) == 1 else "them"
    return f"{'; '.join(rank_text(e) for e in lost)}; {others} went on without {them} and finished"
