"""Configuration is read once (issue 30): the source calls the environment reader (``RunConfig.from_environment``, or
the older ``fast_core.config.run.environment()``) in one place, ``fast_core.run_config()``, which a rank process and
the ``fast`` command alike call; everything else is handed values.

Read from the source with ``ast`` (fast_core, the adapters, examples and benchmarks): a call counts where it is
written, whoever calls the function around it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("fast_core", "adapters", "examples", "benchmarks")
READER_MODULE = "fast_core.config.run"

RANK_READ = ("fast_core/config/current.py", "run_config")
"""The one read of a process: ``fast_core.init()`` makes the engine from it, the Worker and the examples ask it, and
the ``fast`` command's launches start from it."""
AWAITING_OWNERS: set[tuple[str, str]] = set()
"""Reads still to be replaced by ``fast_core.run_config()`` or a value handed down: none (the last one,
``fast_core.config.run.environment()``, is gone)."""


def _reader_names(tree: ast.Module) -> set[str]:
    """The names under which a module imported ``environment`` from the configuration module."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == READER_MODULE
        for alias in node.names
        if alias.name == "environment"
    }


def call_sites() -> list[tuple[str, str, int]]:
    """(file, enclosing function, line) of every call of the environment reader in the source."""
    sites = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            readers = _reader_names(tree) | ({"environment"} if path.match("fast_core/config/run.py") else set())

            def visit(node: ast.AST, function: str, path: Path = path, readers: set[str] = readers) -> None:
                for child in ast.iter_child_nodes(node):
                    inside = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
                    if isinstance(child, ast.Call):
                        called = child.func
                        by_attribute = isinstance(called, ast.Attribute) and called.attr == "from_environment"
                        by_name = isinstance(called, ast.Name) and called.id in readers
                        if by_attribute or by_name:
                            sites.append((path.relative_to(ROOT).as_posix(), function, child.lineno))
                    visit(child, inside)

            visit(tree, "<module>")
    return sites


def test_the_environment_is_read_in_one_place() -> None:
    sites = call_sites()
    where = "\n".join(f"  {path}:{line} in {function}()" for path, function, line in sites)
    found = {(path, function) for path, function, _ in sites}
    assert found - AWAITING_OWNERS == {RANK_READ}, f"calls of the environment reader:\n{where}"
    assert len(sites) == 1, where


def test_the_rank_read_is_kept_and_engines_are_given_numbers(monkeypatch) -> None:
    import fast_core
    from fast_core import LocalCluster

    monkeypatch.setenv("FAST_TIMEOUT", "7")
    first = fast_core.run_config()
    monkeypatch.setenv("FAST_TIMEOUT", "9")
    assert fast_core.run_config() is first and first.timeout == 7  # read once: a later change is not seen
    assert LocalCluster(2).timeout == 120  # an engine never reads the environment: it is given its timeout
