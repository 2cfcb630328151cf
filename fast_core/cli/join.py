"""``fast run --join RUN_DIR -n K``: ask a running job for K more workers and say which ranks joined.

The job must have been started with ``--max-ranks`` (fault tolerant): its rank 0 takes the request from the run
folder, the group starts the new processes itself (they run the job's command, under its launcher, and print among
its lines) and answers once they have joined (``fast_core.runtime.joins``). This command only asks and waits.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from fast_core.cli.common import CLIError, DefaultCount, say
from fast_core.observers.runlog import RUN_FILE
from fast_core.runtime.joins import answer_of, ask_to_join, withdraw

WAIT_STEP = 0.2


def join_job(run_dir: Path, workers: int, timeout: float) -> int:
    """Ask, wait up to ``timeout`` seconds for the answer; 0 when workers joined, 1 when refused or unanswered."""
    workers = 1 if isinstance(workers, DefaultCount) else workers
    described = _running_job(run_dir)
    most = int(described.get("max_ranks") or 0)
    if not described.get("fault_tolerant") or most <= 0:
        raise CLIError(
            f"the job in {run_dir} was started without --max-ranks, so it cannot grow: start it with `fast run "
            "--max-ranks M ...` to let workers join"
        )
    request = ask_to_join(run_dir, workers)
    say(f"asked the job in {run_dir} for {workers} more worker(s) (it may grow to {most} ranks)")
    deadline = time.monotonic() + (timeout if math.isfinite(timeout) else 3600.0)
    while (answer := answer_of(run_dir, request)) is None:
        if time.monotonic() > deadline:
            taken = not withdraw(run_dir, request)
            how = "took the request but has not answered" if taken else "did not take the request"
            say(f"no answer in {timeout:g} s (FAST_TIMEOUT): the job {how}; is it still training?")
            return 1
        time.sleep(WAIT_STEP)
    if "refused" in answer:
        say(f"the job took no new worker: {answer['refused']}")
        return 1
    say(f"rank(s) {answer['joined']} joined the job at step {answer['step']}; it has {answer['size']} ranks now")
    return 0


def _running_job(run_dir: Path) -> dict:
    """run.json of a job started and not ended, or one line saying what ``run_dir`` is instead."""
    path = run_dir / RUN_FILE
    try:
        described = json.loads(path.read_text())
    except FileNotFoundError:
        raise CLIError(f"--join {run_dir}: no {RUN_FILE} there; give the run folder `fast run` printed") from None
    except json.JSONDecodeError as exc:
        raise CLIError(f"--join {run_dir}: {path} is not JSON ({exc})") from None
    if described.get("exit_status") is not None:
        raise CLIError(f"--join {run_dir}: that job has ended (exit status {described['exit_status']})")
    return described
