"""`fast dashboard`: the page's numbers against the records, bad input, a busy port, 64 ranks, and a real browser.

The run folders here are written by the project's own record writer (``RunLog``, what every rank's Reporter uses),
with the fields a rank writes, so each test knows every number it should see. The browser test drives Debian's
chromium through its chromedriver with Selenium (told where both are, so nothing is downloaded); it skips, saying
which, where one of the three is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fast_core.cli import main as fast
from fast_core.cli.dashboard import Background
from fast_core.cli.dashboard.follow import RunFolder
from fast_core.cli.dashboard.server import Dashboard, bind, url
from fast_core.cli.dashboard.view import build, cells
from fast_core.observers.runlog import RUN_FILE, RunLog, rank_file, read_run

COUNTERS = ("bytes_sent", "mean_staleness", "wait_seconds", "consensus_distance")


def step_record(rank: int, step: int, seconds: float, slow: float = 1.0) -> dict:
    """A "step" record as the Reporter writes it, its numbers a function of rank and step alone."""
    return {
        "kind": "step",
        "rank": rank,
        "step": step,
        "time": seconds,
        "bytes_sent": 76880 * step + rank,
        "bytes_received": 76880 * step,
        "messages_sent": 2 * step,
        "wait_seconds": 0.001234 * step * slow,
        "mean_staleness": 0.5 + 0.01 * rank,
        "staleness_max": 1,
        "refused_messages": 0,
        "compute_seconds": 0.01 * step,
        "consensus_distance": 0.0123456 / (1 + step),
        "loss": 2.0 / (1 + step),
        "samples": 16.0 * step,
        "steps_per_second": 1 / (0.01 * slow),
    }


def recorded_run(
    folder: Path, size: int = 4, steps: int = 100, every: int = 10, slow: int | None = None, closed: bool = True
) -> Path:
    """A run folder of ``size`` ranks, ``steps`` steps each, a step record every ``every``; rank ``slow`` steps at
    a quarter of the others' rate; a budget of all their samples."""
    folder.mkdir(parents=True, exist_ok=True)
    budget = int(16 * steps * size)
    (folder / RUN_FILE).write_text(json.dumps({"workers": size, "strategy": "dpsgd:ring", "topology": None}))
    for rank in range(size):
        pace = 0.01 * (4 if rank == slow else 1)
        log = RunLog(rank_file(folder, rank))
        start = {"kind": "start", "rank": rank, "step": 0, "time": 0.0, "size": size, "log_every": every}
        log.write({**start, "wall_start": time.time() - steps * pace, "budget_samples": budget, "budget_seconds": None})
        for step in range(every, steps + 1, every):
            log.write(step_record(rank, step, step * pace, 4 if rank == slow else 1))
        if closed:
            log.write({"kind": "close", "rank": rank, "step": steps, "time": steps * pace, "samples": 16.0 * steps})
    return folder


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A 4-rank finished run folder and the URL of its dashboard."""
    folder = recorded_run(tmp_path / "run")
    server, _ = bind(Dashboard(folder), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, url(server)
    server.shutdown()
    server.server_close()


def get(address: str) -> bytes:
    with urllib.request.urlopen(address, timeout=30) as answer:
        return answer.read()


def last_value(records: list[dict], key: str) -> object:
    return next(r[key] for r in reversed(records) if r.get(key) is not None)


# the numbers ---------------------------------------------------------------------------------------------------------
def test_the_state_holds_the_records_numbers_and_prints_them(served: tuple[Path, str]) -> None:
    folder, address = served
    state = json.loads(get(address + "state.json"))
    records = read_run(folder)
    assert [row["rank"] for row in state["ranks"]] == sorted(records)
    for row in state["ranks"]:
        mine = records[row["rank"]]
        for key in (*COUNTERS, "step", "samples"):
            assert row["values"][key] == last_value(mine, key), key  # the record's own value, not a rounding
        steps = [r for r in mine if r["kind"] == "step"][-3:]
        waited = steps[-1]["wait_seconds"] - steps[0]["wait_seconds"]
        pace = (steps[-1]["step"] - steps[0]["step"]) / (steps[-1]["time"] - steps[0]["time"] - waited)
        assert row["values"]["steps_per_second"] == steps[-1]["steps_per_second"]  # the record's own rate
        assert row["values"]["own_steps_per_second"] == pace
        assert row["cells"] == cells(row["values"])
        assert row["cells"]["bytes_sent"] == f"{last_value(mine, 'bytes_sent') / 1e6:.2f}"
        assert row["state"] == "closed"
    assert state["budget"]["done"] == sum(last_value(r, "samples") for r in records.values())
    assert state["budget"]["fraction"] == 1.0 and state["budget"]["eta_text"] == "done"
    assert state["skipped_total"] == 0 and state["live"] is False
    for picture in ("topology", "ranks", "consensus"):
        assert get(f"{address}{picture}.svg").lstrip().startswith(b"<?xml")
    assert b"<script>" in get(address) and b"http" not in get(address).split(b"<script>")[1]  # nothing fetched


def test_a_slow_a_lost_and_a_silent_rank_are_marked(tmp_path: Path) -> None:
    folder = recorded_run(tmp_path, size=6, slow=1, closed=False)
    (folder / "exits").mkdir()
    (folder / "exits" / "rank2.json").write_text(json.dumps({"rank": 2, "signal": "SIGKILL", "wall": time.time()}))
    now = time.time()
    for rank in range(6):  # rank 3 last wrote 10 s before the others
        os.utime(rank_file(folder, rank), (now - (10 if rank == 3 else 0),) * 2)
    run = RunFolder(folder)
    run.refresh()
    view = build(run, now)
    states = {row.rank: row.state for row in view.ranks}
    assert states == {0: "running", 1: "slow", 2: "lost", 3: "silent", 4: "running", 5: "running"}
    assert view.live and len(view.alerts) == 3
    assert "rank 2 lost: killed by SIGKILL" in view.alerts


def test_a_replaced_rank_and_one_a_recovery_counted_lost_are_marked(tmp_path: Path) -> None:
    folder = recorded_run(tmp_path, size=4, closed=False)
    membership = {"kind": "membership", "rank": 0, "step": 100, "time": 1.0, "lost": "1,3", "replaced": "1", "size": 3}
    RunLog(rank_file(folder, 0)).write(membership)
    new = {"kind": "start", "rank": 1, "step": 100, "time": 0.0, "size": 4, "wall_start": time.time()}
    RunLog(rank_file(folder, 1)).write(new)  # the process that took rank 1 over starts its own records
    run = RunFolder(folder)
    run.refresh()
    view = build(run)
    assert [(row.state, row.replaced) for row in view.ranks] == [
        ("running", False),
        ("starting", True),
        ("running", False),
        ("lost", False),
    ]
    assert "rank 3 lost: lost at step 100" in view.alerts and "rank 1: a new process took over" in view.alerts


def test_malformed_lines_are_skipped_and_counted_never_a_broken_page(served: tuple[Path, str]) -> None:
    folder, address = served
    with open(rank_file(folder, 1), "a") as f:
        f.write('{"kind": "step", "rank": 1, "st\n[1, 2]\n{"kind": "step", "rank": 1, "step": 1')  # cut mid-write
    skipped: dict[int, int] = {}
    assert len(read_run(folder, skipped=skipped)[1]) == len(read_run(folder)[1])
    assert skipped == {1: 3}  # read_run reads the unfinished last line too: it counts as skipped there
    time.sleep(0.6)  # past the dashboard's refresh interval
    state = json.loads(get(address + "state.json"))
    assert state["skipped_total"] == 2  # a live reader leaves the unfinished last line for the next read
    assert any("malformed" in alert for alert in state["alerts"])
    assert get(address + "ranks.svg") and get(address)


# bad input -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("made", [False, True], ids=["missing", "empty"])
def test_a_folder_without_records_is_one_line_and_status_2(tmp_path: Path, capsys, made: bool) -> None:
    folder = tmp_path / "nothing"
    if made:
        folder.mkdir()
    with pytest.raises(SystemExit) as ended:
        fast(["dashboard", str(folder)])
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"fast: error: run folder {folder}")
    assert ("does not exist" if not made else "holds no records") in error


def test_a_port_in_use_moves_to_the_next_and_says_so(tmp_path: Path) -> None:
    folder = recorded_run(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server, said = bind(Dashboard(folder), "127.0.0.1", port)
        server.server_close()
    assert server.server_address[1] != port
    assert said == f"port {port} is in use; serving on port {server.server_address[1]}"


def test_fast_run_dashboard_serves_while_the_job_runs_and_stops_after(tmp_path: Path) -> None:
    board = Background(recorded_run(tmp_path, closed=False), "127.0.0.1:0")
    assert json.loads(get(url(board.server) + "state.json"))["live"] is True
    board.stop()
    with pytest.raises(OSError):
        get(url(board.server) + "state.json")


# 64 ranks ------------------------------------------------------------------------------------------------------------
def test_64_ranks_are_read_and_drawn_in_a_few_seconds(tmp_path: Path) -> None:
    """The goal is a page that keeps up with its one-second poll. The figures are drawn once per new batch of records,
    so what matters is one full read and redraw: on an idle machine it takes about a second here (the time is
    printed); the bound is 20 s, loose enough for a CI machine running two test processes and another job, tight
    enough to catch a redraw per rank or per record (minutes)."""
    folder = recorded_run(tmp_path, size=64, steps=2000, every=10, slow=17, closed=False)
    began = time.perf_counter()
    board = Dashboard(folder)
    view = board.view()
    sizes = {name: len(board.picture(name)) for name in ("topology", "ranks", "consensus")}
    took = time.perf_counter() - began
    print(f"64 ranks x 200 records: read and drawn in {took:.2f} s; SVG bytes {sizes}")
    assert len(view.ranks) == 64 and view.records == 64 * 201
    assert [row.rank for row in view.ranks if row.state == "slow"] == [17]
    assert took < 20.0
    assert all(size < 2_000_000 for size in sizes.values())


# a real browser ------------------------------------------------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser(monkeypatch: pytest.MonkeyPatch):
    """Headless chromium under Selenium, or a skip naming what is missing (Debian: apt-get install chromium
    chromium-driver; pip install selenium)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not shutil.which(path):
            pytest.skip(f"{path} not found: apt-get install {package} (Debian's, not a downloaded browser)")
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager, should it run at all, fetches nothing
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1400"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


def test_the_page_in_a_browser_shows_the_ranks_and_follows_a_new_record(tmp_path: Path, monkeypatch) -> None:
    driver = browser(monkeypatch)
    from selenium.webdriver.support.ui import WebDriverWait

    folder = recorded_run(tmp_path, closed=False)
    server, _ = bind(Dashboard(folder), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        driver.get(url(server))
        wait = WebDriverWait(driver, 30)

        def cell(rank: int, key: str) -> str | None:  # read in the page at once: the rows are redrawn each second
            found = f"return document.querySelector('tr[data-rank=\"{rank}\"] td.{key}')"
            return driver.execute_script(f"{found}?.textContent")

        wait.until(lambda d: d.execute_script("return document.querySelectorAll('#ranks tr').length") == 4)
        assert cell(2, "bytes_sent") == f"{(76880 * 100 + 2) / 1e6:.2f}" and cell(2, "step") == "100"
        wait.until(lambda d: d.execute_script("return document.getElementById('topology').naturalWidth") > 0)
        RunLog(rank_file(folder, 2)).write(step_record(2, 110, 1.1))
        appended = time.monotonic()
        wait.until(lambda d: cell(2, "step") == "110")
        print(f"the appended record was on the page after {time.monotonic() - appended:.2f} s")
        assert time.monotonic() - appended < 5.0 + 5.0  # the goal is 5 s; a busy CI machine gets 5 more
        assert cell(2, "mean_staleness") == "0.52"
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
