"""The code blocks of README.md and docs/: how they are found, marked and run (conventions: docs/contributing.md)."""

from __future__ import annotations

import configparser
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[^`\s]*)\s*$")
MARK = re.compile(r"^\s*<!--\s*(?P<kind>fragment|skip|file|test)\b:?\s*(?P<value>.*?)\s*-->\s*$")
LANGUAGES = {"python", "bash", "text"}  # text: a program's output or a listing, never run

# Flags a test form may change or add: how many ranks, and how long or how much a run trains. Nothing else.
SIZE_FLAGS = {"-n", "--np", "--epochs", "--steps", "--repeats", "--budget-samples", "--budget-seconds"}

# A block needs a framework when its text (or a file block it runs) names one; the first match picks the tox env
# (the tf env installs torch and jax too, as Keras' other backends).
FRAMEWORKS = {
    "tf": (re.compile(r"(?<![A-Za-z])(keras|fast_tf)(?![A-Za-z])|--framework tf\b"), ("keras", "tensorflow")),
    "torch": (re.compile(r"(?<![A-Za-z])torch(?![A-Za-z])|--framework torch\b"), ("torch",)),
    "jax": (re.compile(r"(?<![A-Za-z])(jax|flax|optax)(?![A-Za-z])|--framework jax\b"), ("jax", "optax", "flax")),
}


@dataclass
class Block:
    page: Path
    line: int  # the opening fence's line, from 1
    lang: str
    text: str
    marks: dict[str, list[str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{_shown(self.page)}:{self.line}"

    @property
    def kind(self) -> str:
        """fragment, skip, file, output, doctest, python or bash."""
        for kind in ("fragment", "skip", "file"):
            if kind in self.marks:
                return kind
        if self.lang == "text":
            return "output"
        if self.lang == "python" and self.text.lstrip().startswith(">>>"):
            return "doctest"
        return self.lang

    def files(self, blocks: list[Block]) -> dict[str, str]:
        """The file blocks of this block's page, by name."""
        return {b.marks["file"][0]: b.text for b in blocks if b.page == self.page and b.kind == "file"}

    def framework(self, blocks: list[Block]) -> str:
        """core, or the tox env (torch, tf, jax) whose framework this block or a file it runs needs."""
        used = [text for name, text in self.files(blocks).items() if name in self.text]
        for env, (pattern, _) in FRAMEWORKS.items():
            if any(pattern.search(text) for text in [self.text, *used]):
                return env
        return "core"


def read_blocks(page: Path) -> list[Block]:
    """Every fenced block of a page with the marks on the lines right above its fence; an indented code block or an
    unclosed fence is an error, so that no block escapes the test."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if lines[i].startswith("    ") and i > 0 and not lines[i - 1].strip() and not _in_list(lines, i):
                raise ValueError(f"{_shown(page)}:{i + 1}: an indented code block; use a fence")
            i += 1
            continue
        marks: dict[str, list[str]] = {}
        above = i - 1
        while above >= 0 and (mark := MARK.match(lines[above])):
            marks.setdefault(mark["kind"], []).insert(0, mark["value"])
            above -= 1
        end = i + 1
        closing = re.compile(rf"^ *{re.escape(opening['fence'][0])}{{{len(opening['fence'])},}}\s*$")
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{_shown(page)}:{i + 1}: a fence that never closes")
        indent = len(opening["indent"])
        text = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        blocks.append(Block(page, i + 1, opening["lang"], text, marks))
        i = end + 1
    return blocks


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def _in_list(lines: list[str], i: int) -> bool:
    """Whether line i continues a list item (an indented paragraph under "- " or "1. ")."""
    for line in reversed(lines[:i]):
        if line.strip() and not line.startswith(" "):
            return bool(re.match(r"(\s*[-*+]|\s*\d+\.)\s", line))
    return False


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in read_blocks(page)]


def commands(script: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped, ``a && b`` split."""
    joined = re.sub(r"\\\n\s*", " ", script)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                found.append(shlex.join(command))
                command = []
            else:
                command.append(word)
    return found


def without_sizes(command: str) -> list[str]:
    """The words of a command with every size flag and its value taken out (``--epochs 1``, ``--epochs=1``)."""
    words, kept = shlex.split(command), []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in SIZE_FLAGS:
            skip = True
        elif word.split("=", 1)[0] not in SIZE_FLAGS:
            kept.append(word)
    return kept


def shortened(block: Block) -> list[str]:
    """The block's commands as the test runs them: each ``<!-- test: ... -->`` form replaces the one documented
    command it equals once size flags are set aside; a form that matches no command, or several, is an error."""
    documented = commands(block.text)
    run = list(documented)
    for form in block.marks.get("test", []):
        matches = [k for k, command in enumerate(documented) if without_sizes(command) == without_sizes(form)]
        if len(matches) != 1:
            raise ValueError(
                f"{block.name}: the test form {form!r} must be one documented command with only size flags "
                f"({', '.join(sorted(SIZE_FLAGS))}) changed; it matches {len(matches)} of {documented}"
            )
        run[matches[0]] = form
    return run


def ranks(command: str) -> int | None:
    """The ranks a launch (mpiexec, fast run, fast bench) starts, None for anything else."""
    words = shlex.split(command)
    launch = words[:1] == ["mpiexec"] or words[:2] in (["fast", "run"], ["fast", "bench"])
    if not launch:
        return None
    for k, word in enumerate(words[:-1]):
        if word in ("-n", "--np"):
            return int(words[k + 1])
    return None


def check_setup_command(command: str) -> None:
    """``pip install`` and ``tox`` are not run by the test (the tox env already is that install, and tox would run
    itself); their extras, pins and envs must exist in pyproject.toml and tox.ini."""
    words = shlex.split(command)
    extras = optional_dependencies()
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    if words[:2] == ["pip", "install"]:
        for word in words[2:]:
            if word.startswith("-"):
                continue
            named = re.fullmatch(r"(?:\.|fast-training)\[(?P<extras>[^\]]+)\]", word)
            if named:
                unknown = set(named["extras"].split(",")) - set(extras)
                assert not unknown, f"{command}: no extra {sorted(unknown)} in pyproject.toml"
            elif "==" in word:
                assert word in (ROOT / "tox.ini").read_text(), f"{command}: tox.ini pins another version than {word}"
            else:
                assert re.fullmatch(r"[A-Za-z0-9_.-]+(\[[a-z,]+\])?([<>=!~]=?[0-9.]+)?", word), word
    elif words[0] == "tox":
        envs = [e.strip() for e in tox.get("tox", "env_list").split(",")]
        for k, word in enumerate(words[:-1]):
            if word == "-e":
                assert all(e in envs for e in words[k + 1].split(",")), f"{command}: tox.ini lists {envs}"
    else:
        raise AssertionError(f"not a setup command: {command}")


def optional_dependencies() -> set[str]:
    """The extras pyproject.toml declares (read without a TOML parser: Python 3.10 has none)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_-]+) =", section, flags=re.M))


def is_setup_command(command: str) -> bool:
    words = shlex.split(command)
    return words[:2] == ["pip", "install"] or words[:1] == ["tox"]


def documented_commands(page: str, names: str) -> list[list[str]]:
    """The commands, in their test forms, of the one bash block of ``page`` (a path from the repository's root) that
    names ``names``: for a test that runs a documented block itself and checks its output, where test_docs.py
    skips the block (``<!-- skip: tests/... runs it -->``) so it does not run twice."""
    found = [b for b in read_blocks(ROOT / page) if b.lang == "bash" and names in b.text]
    if len(found) != 1:
        raise ValueError(f"{page}: {len(found)} bash blocks name {names!r}; the test expects one")
    return [shlex.split(command) for command in shortened(found[0])]
