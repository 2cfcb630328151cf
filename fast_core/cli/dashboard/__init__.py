"""``fast dashboard RUN_DIR`` (and ``fast run --dashboard``): a web page on localhost that follows a run folder.

It reads only what the job already writes (the ranks' records, run.json, the guards' exits and the ranks' errors),
so it shows a live job and a finished one alike, and may be started, stopped and started again at any time.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

from fast_core.cli.common import CLIError, say
from fast_core.cli.dashboard.server import DEFAULT_PORT, Dashboard, bind, url
from fast_core.observers.runlog import RUN_FILE, rank_files

LOCAL = "127.0.0.1"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="watch a run folder in a web browser (live or finished)",
        description="Serve a page that shows a run folder as it grows: the topology with each rank coloured by its "
        "speed, per-rank step rate, staleness and bytes over time, the consensus model, the budget and its ETA.",
        epilog="example: fast dashboard runs/20260101-120000-dpsgd-ring",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the folder fast run wrote (--run-dir)")
    parser.add_argument("--host", default=LOCAL, help=f"address to bind (default {LOCAL}: this machine only)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"default {DEFAULT_PORT}; in use: the next free one, said",
    )
    parser.set_defaults(handler=main)


def check_run_dir(run_dir: Path) -> None:
    """One line for a folder that is no run folder: missing, or without records and no job about to write them."""
    if not run_dir.is_dir():
        raise CLIError(f"run folder {run_dir} does not exist: give the folder fast run named ('run folder: ...')")
    if not rank_files(run_dir) and not (run_dir / RUN_FILE).exists():
        raise CLIError(
            f"run folder {run_dir} holds no records (no rank<r>.jsonl): give the folder a fast run wrote, "
            "or start the job with fast run --run-dir DIR --dashboard"
        )


def main(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir)
    server, moved = bind(Dashboard(args.run_dir), args.host, args.port)
    if moved:
        say(moved)
    say(f"dashboard of {args.run_dir} at {url(server)} (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


class Background:
    """``fast run --dashboard``: the same server on a thread of the launcher, for the job's length."""

    def __init__(self, run_dir: Path, where: str) -> None:
        host, _, port = where.rpartition(":")
        if not port.isdigit():
            raise CLIError(f"--dashboard-at {where!r}: give a port or HOST:PORT, e.g. 8050 or 0.0.0.0:8050")
        self.server, moved = bind(Dashboard(run_dir), host or LOCAL, int(port))
        if moved:
            say(moved)
        say(f"dashboard at {url(self.server)} (until the job ends; then: fast dashboard {run_dir})")
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
