"""The import graph of fast_core and the adapters has no cycle: each layer imports only the layers below it.

Read from the source with ``ast``: every import counts, at module level or inside a function (a lazy import that
closes a cycle is still a cycle); only imports under ``if TYPE_CHECKING:`` (type hints) do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "fast_core": ROOT / "fast_core",
    "fast_torch": ROOT / "adapters" / "torch",
    "fast_tf": ROOT / "adapters" / "tf",
    "fast_jax": ROOT / "adapters" / "jax",
}


def _module_name(package: str, path: Path) -> str:
    parts = list(path.relative_to(PACKAGES[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    known: set[str] = set()
    files: list[tuple[str, Path]] = []
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            name = _module_name(package, path)
            known.add(name)
            files.append((name, path))
    for name, path in files:
        graph.add_node(name)
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, is_package, node)
                # "from . import x" names a submodule x; "from .m import f" names module m
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)  # a module importing its own package's __init__ is not a cycle
    return graph


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 40  # the walk found the modules
    cycles = sorted(nx.simple_cycles(graph), key=len)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:10])


def test_the_check_finds_a_cycle_when_there_is_one() -> None:
    graph = import_graph()
    graph.add_edge("fast_core.model.flat", "fast_core.runtime.worker")  # the worker imports flat: this closes a cycle
    assert list(nx.simple_cycles(graph))
