"""The dashboard's web server: the standard library's threading HTTP server, one page, one JSON state, three SVGs.

The page polls ``/state.json`` every second and reloads a picture only when the state's ``version`` changed, so an
idle finished run costs nothing, and a live one redraws at most once per new batch of records. Binds to 127.0.0.1
unless told otherwise: the records name hosts, commands and paths.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

from fast_core.cli.common import CLIError
from fast_core.cli.dashboard import figures
from fast_core.cli.dashboard.follow import RunFolder
from fast_core.cli.dashboard.view import View, build

REFRESH_SECONDS = 0.5
"""The run folder is read at most this often, however many pages poll it."""
FIGURE_SECONDS = 2.0
"""The pictures of a live run are redrawn for new records at most this often: each drawing of 64 ranks takes the
server about a second of one core, which the job on the same machine should keep."""
PORT_TRIES = 20
"""A port in use: the next ones are tried, up to this many in all."""
DEFAULT_PORT = 8050


class Dashboard:
    """One run folder's view and pictures, read and drawn on demand, shared by the request threads."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = RunFolder(run_dir)
        self._lock = threading.Lock()
        self._view: View | None = None
        self._records: tuple = ()  # what the pictures were last told of the records
        self._states: list = []  # and of the ranks' states
        self._version = 0
        self._versioned_at = 0.0
        self._draw_seconds: dict[str, float] = {}
        self._pictures: dict[str, tuple[int, bytes]] = {}

    def view(self) -> View:
        """The view now (the folder re-read if the last read is older than ``REFRESH_SECONDS``). Its ``version``, which
        the pictures follow, changes at once with a rank's state, and for new records at most every
        ``FIGURE_SECONDS`` (or four times the last drawing's time, on a slow machine)."""
        with self._lock:
            now = time.time()
            if self._view is None or now - self.folder.read_at >= REFRESH_SECONDS:
                self.folder.refresh()
                view = build(self.folder, now)
                records = (view.records, view.live, view.skipped)
                states = [(r.rank, r.state, r.replaced) for r in view.ranks]
                pace = max(FIGURE_SECONDS, 4 * sum(self._draw_seconds.values()))
                if states != self._states or (records != self._records and now - self._versioned_at >= pace):
                    self._records, self._states = records, states
                    self._version, self._versioned_at = self._version + 1, now
                view.version = self._version
                self._view = view
            return self._view

    def picture(self, name: str) -> bytes:
        """The SVG ``name`` of the current view, drawn once per version."""
        view = self.view()
        with self._lock:
            cached = self._pictures.get(name)
            if cached is None or cached[0] != view.version:
                began = time.perf_counter()
                records = self.folder.records
                if name == "topology":
                    first = next((s.samples.start for s in self.folder.ranks.values() if s.samples.start), None)
                    svg = figures.topology(view, self.folder.run, first or {})
                elif name == "ranks":
                    svg = figures.ranks(view, records)
                else:
                    svg = figures.consensus(view, records)
                cached = self._pictures[name] = (view.version, svg)
                self._draw_seconds[name] = time.perf_counter() - began
            return cached[1]


def page() -> bytes:
    """The page, shipped in the package (no script or style from anywhere else)."""
    return resources.files("fast_core.cli.dashboard").joinpath("page.html").read_bytes()


def handler(dashboard: Dashboard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            path = self.path.split("?", 1)[0]
            try:
                if path in ("/", "/index.html"):
                    self._send(page(), "text/html; charset=utf-8")
                elif path == "/state.json":
                    self._send(json.dumps(dashboard.view().as_json()).encode(), "application/json")
                elif path in ("/topology.svg", "/ranks.svg", "/consensus.svg"):
                    self._send(dashboard.picture(path[1:-4]), "image/svg+xml")
                else:
                    self.send_error(404, "the dashboard serves /, /state.json and three .svg pictures")
            except (BrokenPipeError, ConnectionResetError):  # the page went away mid-answer
                pass

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
            pass  # a line per poll would bury the job's own output

    return Handler


def bind(dashboard: Dashboard, host: str, port: int) -> tuple[ThreadingHTTPServer, str | None]:
    """A server on ``host``:``port``, or on the next free port after it (then a line saying so); port 0: any free."""
    for tried in range(port, port + (PORT_TRIES if port else 1)):
        try:
            server = ThreadingHTTPServer((host, tried), handler(dashboard))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise CLIError(
                    f"cannot serve on {host}:{tried}: {exc.strerror} (give another --host or --port)"
                ) from exc
            continue
        server.daemon_threads = True
        moved = None if tried == port else f"port {port} is in use; serving on port {tried}"
        return server, moved
    raise CLIError(f"ports {port} to {port + PORT_TRIES - 1} are all in use on {host}: give a free one with --port")


def url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"
