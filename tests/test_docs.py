"""Every code block of README.md and docs/ runs as written (with its test form's smaller sizes), or is marked as a
fragment or skipped with a reason; every link of README.md resolves. The conventions: docs/contributing.md.

Blocks that need a framework run in that framework's tox env (tox.ini names this file's test for it); elsewhere they
skip, saying where they run. Each block runs in a folder of its own, in a fresh process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from docblocks import (
    FRAMEWORKS,
    LANGUAGES,
    PAGES,
    ROOT,
    Block,
    all_blocks,
    check_setup_command,
    commands,
    is_setup_command,
    ranks,
    read_blocks,
    shortened,
)

BLOCKS = all_blocks()
RUN = ("python", "doctest", "bash", "skip")
TIMEOUT = 840  # the main job's test form, 6 launches of torch on 2 busy cores, took 3.7 minutes


def blocks_of(env: str) -> list:
    return [pytest.param(b, id=b.name) for b in BLOCKS if b.kind in RUN and b.framework(BLOCKS) == env]


def block_test(env: str):
    """The test of the blocks that run in one tox env: test_core_block, test_torch_block, ... (tox.ini names them)."""

    @pytest.mark.timeout(TIMEOUT + 60)
    @pytest.mark.parametrize("block", blocks_of(env))
    def test(block: Block, tmp_path: Path) -> None:
        run_block(block, tmp_path)

    return test


test_core_block = block_test("core")
test_torch_block = block_test("torch")
test_tf_block = block_test("tf")
test_jax_block = block_test("jax")


def run_block(block: Block, folder: Path) -> None:
    if block.kind == "skip":
        pytest.skip(f"{block.name} is not run: {block.marks['skip'][0]}")
    env = block.framework(BLOCKS)
    if env != "core":
        missing = [m for m in FRAMEWORKS[env][1] if importlib.util.find_spec(m) is None]
        if missing:
            pytest.skip(f"{', '.join(missing)} not installed here: {block.name} runs in tox -e {env}")
    for name in ("examples", "benchmarks", "tests"):
        (folder / name).symlink_to(ROOT / name)
    for name, text in block.files(BLOCKS).items():
        (folder / name).write_text(text)
    if block.kind == "python":
        (folder / "block.py").write_text(block.text)
        run(block, [sys.executable, "block.py"], folder)
    elif block.kind == "doctest":
        (folder / "block.txt").write_text(block.text)
        run(block, [sys.executable, "-m", "doctest", "block.txt"], folder)
    else:
        for command in shortened(block):
            if is_setup_command(command):
                check_setup_command(command)
            else:
                run(block, ["bash", "-c", command], folder)


def run(block: Block, argv: list[str], folder: Path) -> None:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, PATH=path, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    try:
        done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.name}: {shlex.join(argv)} ran past {TIMEOUT} s:\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, (
        f"{block.name}: {shlex.join(argv)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )


def test_every_block_has_a_language_the_test_knows() -> None:
    unknown = [f"{b.name}: {b.lang or 'none'}" for b in BLOCKS if b.lang not in LANGUAGES]
    assert not unknown, f"give each fence one of {sorted(LANGUAGES)}: {unknown}"


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in BLOCKS if b.kind in ("fragment", "skip")])
def test_fragments_and_skipped_blocks_still_parse(block: Block) -> None:
    if block.lang == "python":
        compile(block.text, block.name, "exec")
    elif block.lang == "bash":
        done = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
        assert done.returncode == 0, f"{block.name}: {done.stderr}"
    else:
        pytest.fail(f"{block.name}: only python and bash blocks are fragments or skipped; {block.lang} is output")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in BLOCKS if b.kind == "bash"])
def test_test_forms_change_only_sizes_and_launch_at_most_two_ranks(block: Block) -> None:
    """Framework-free, so a torch block's test form is checked in every env, not only where torch is."""
    run = shortened(block)
    assert len(run) == len(commands(block.text))
    for command in run:
        if is_setup_command(command):
            check_setup_command(command)
        launched = ranks(command)
        assert launched is None or launched <= 2, (
            f"{block.name}: {command!r} starts {launched} ranks; add <!-- test: ... --> with -n 2 above the fence"
        )
    for kind in ("test", "file"):
        assert kind not in block.marks or block.lang in ("bash", "python"), f"{block.name}: {kind} on {block.lang}"


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in BLOCKS if b.kind == "file"])
def test_every_file_block_is_run_by_a_command_of_its_page(block: Block) -> None:
    name = block.marks["file"][0]
    users = [b for b in BLOCKS if b.page == block.page and b.kind == "bash" and name in b.text]
    assert users, f"{block.name}: no bash block of {block.page.name} runs {name}"


def test_marks_are_found() -> None:
    """The parser sees the marks this repository uses (a typo in the parser would make every block plain)."""
    kinds = {b.kind for b in BLOCKS}
    assert {"fragment", "skip", "file", "output", "python", "bash", "doctest"} <= kinds, kinds


def test_an_indented_code_block_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n    fast run -n 4 train.py\n")
    with pytest.raises(ValueError, match="indented code block"):
        read_blocks(page)


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slugs(page: Path) -> set[str]:
    """GitHub's anchors for the headings of a page."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_link_of_the_readme_resolves() -> None:
    readme = ROOT / "README.md"
    text = re.sub(r"```.*?```", "", readme.read_text(), flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    links = [t for t in LINK.findall(text) if not t.startswith(("http://", "https://", "mailto:"))]
    assert len(links) >= 10, links
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        page = ROOT / path if path else readme
        if not page.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in slugs(page):
            broken.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken, broken


def test_pages_are_read() -> None:
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "contributing.md" in PAGES, PAGES


def test_every_strategy_string_the_strategies_page_gives_is_accepted() -> None:
    import fast_core

    page = (ROOT / "docs" / "strategies" / "index.md").read_text()
    lines = re.findall(r"^\*\*Examples:\*\*(.+(?:\n(?!\n).+)*)", page, flags=re.M)
    examples = [s for line in lines for s in re.findall(r"`([^`]+)`", line)]
    assert len(examples) >= 30, examples
    refused = []
    for spec in examples:
        try:
            fast_core.make_strategy(spec)
        except fast_core.ConfigError as exc:
            refused.append(f"{spec}: {exc}")
    assert not refused, refused


def help_flags(command: str) -> set[str]:
    """The flags ``fast COMMAND --help`` lists (without -h/--help)."""
    from fast_cli import fast

    done = fast(command, "--help")
    assert done.returncode == 0, done.stderr
    options = done.stdout.split("options:", 1)[1]
    flags = set()
    for line in options.splitlines():
        if re.match(r"^  -", line):
            flags |= set(re.findall(r"(?:^|, )(-{1,2}[a-z][\w-]*)", line.strip()))
    return flags - {"-h", "--help"}


@pytest.mark.parametrize("command", ["run", "bench", "topology", "simulate", "model", "dashboard"])
def test_the_cli_reference_lists_exactly_the_flags_of_each_command(command: str) -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    section = re.split(r"^## fast ", page, flags=re.M)
    text = next(s for s in section if s.startswith(command + "\n"))
    first_cells = re.findall(r"^\| (`[^|]*?`(?:, `[^|]*?`)*) \|", text, flags=re.M)
    documented = {flag for cell in first_cells for flag in re.findall(r"`(-{1,2}[a-z][\w-]*)", cell)}
    listed = help_flags(command)
    assert documented == listed, f"fast {command}: only in --help {listed - documented}, only in docs/cli.md " + str(
        documented - listed
    )


def test_a_test_form_may_change_sizes_only(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    fence = "```"
    page.write_text(
        f"<!-- test: fast run -n 2 -m mod --epochs 1 -->\n{fence}bash\nfast run -n 4 -m mod\n{fence}\n\n"
        f"<!-- test: fast run -n 2 --strategy allreduce -m mod -->\n{fence}bash\nfast run -n 4 -m mod\n{fence}\n"
    )
    resized, changed = read_blocks(page)
    assert shortened(resized) == ["fast run -n 2 -m mod --epochs 1"]
    with pytest.raises(ValueError, match="only size flags"):
        shortened(changed)
