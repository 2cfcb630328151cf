"""The import graph of fast_core and the adapters: no cycle, and every package imports only the layers below its own.

Read from the source with ``ast``: every import counts, at module level, inside a function (a lazy import that closes
a cycle is still a cycle) or under ``if TYPE_CHECKING:`` (a type hint that needs a module makes the two depend on
each other all the same).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "fast_core": ROOT / "fast_core",
    "fast_torch": ROOT / "adapters" / "torch",
    "fast_tf": ROOT / "adapters" / "tf",
    "fast_jax": ROOT / "adapters" / "jax",
}

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "metrics"),  # two of fast_core's loose modules
    ("model", "topology", "data", "grammar"),  # grammar: the third loose module, the spec strings' grammar
    ("config",),
    ("engine",),
    ("compression",),
    ("transport",),
    ("strategies",),
    ("observers",),
    ("runtime",),
    ("interop",),
    ("simulate", "pipeline"),
    ("perfmodel",),
    ("cli",),
    ("fast_core",),  # the package's own names (fast_core/__init__.py), what the adapters and users import
    ("fast_torch", "fast_tf", "fast_jax"),
)
"""The layers, bottom to top: a package may import its own modules and the packages of the layers below, never one
above nor another of its own layer. A name is a package of fast_core (``fast_core.<name>``), fast_core itself, or an
adapter. docs/architecture.md shows the same table."""

ALLOWED: dict[tuple[str, str], str] = {
    # (importer module, imported module): why it may stay for now; none today
}
"""Known imports against the layers, each with its reason; an entry whose import is gone must be removed."""


@dataclass(frozen=True)
class Import:
    """``importer`` imports ``imported`` (both modules of PACKAGES) at ``path``:``line``."""

    importer: str
    imported: str
    path: str
    line: int


def _module_name(package: str, path: Path) -> str:
    parts = list(path.relative_to(PACKAGES[package]).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def module_imports(name: str, is_package: bool, source: str, known: set[str], path: str = "") -> Iterator[Import]:
    """Every import of ``known`` modules in ``source`` (module ``name``), type-only ones included."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_package, node)
            # "from . import x" names a submodule x; "from .m import f" names module m
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield Import(name, target, path, node.lineno)


def all_imports() -> list[Import]:
    files = [(package, path) for package, folder in PACKAGES.items() for path in sorted(folder.rglob("*.py"))]
    known = {_module_name(package, path) for package, path in files}
    found: list[Import] = []
    for package, path in files:
        name, shown = _module_name(package, path), str(path.relative_to(ROOT))
        found += module_imports(name, path.name == "__init__.py", path.read_text(), known, shown)
    return found


def import_graph(imports: list[Import] | None = None) -> nx.DiGraph:
    graph = nx.DiGraph()
    for found in all_imports() if imports is None else imports:
        graph.add_node(found.importer)
        if not found.importer.startswith(found.imported + "."):  # a module importing its own package's __init__
            graph.add_edge(found.importer, found.imported)
    return graph


def package_of(module: str) -> str:
    """The LAYERS name of a module: ``fast_core.engine.mpi`` -> "engine", ``fast_core`` -> itself, an adapter's
    module -> the adapter."""
    top, _, rest = module.partition(".")
    return rest.partition(".")[0] if top == "fast_core" and rest else top


def layer_violations(imports: list[Import]) -> list[str]:
    """One line per import of a package from a higher layer or from another package of its own layer."""
    level = {package: index for index, layer in enumerate(LAYERS) for package in layer}
    found = []
    for each in imports:
        low, high = package_of(each.importer), package_of(each.imported)
        if low == high or (each.importer, each.imported) in ALLOWED:
            continue
        if level[high] >= level[low]:
            where = "the same layer as" if level[high] == level[low] else "a layer above"
            found.append(
                f"{each.path}:{each.line}: {each.importer} imports {each.imported}, {where} it "
                f"({low}: layer {level[low]}, {high}: layer {level[high]})"
            )
    return found


# the checks ----------------------------------------------------------------------------------------------------------
def test_the_import_graph_has_no_cycle_type_hints_included() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 40  # the walk found the modules
    cycles = sorted(nx.simple_cycles(graph), key=len)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:10])


def test_every_package_is_in_one_layer() -> None:
    placed = [package for layer in LAYERS for package in layer]
    assert len(placed) == len(set(placed)), "a package in two layers"
    found = {package_of(node) for node in import_graph().nodes}
    missing, gone = sorted(found - set(placed)), sorted(set(placed) - found)
    assert not missing and not gone, f"packages not placed in LAYERS: {missing}; placed but gone: {gone}"


def test_each_package_imports_only_the_layers_below() -> None:
    violations = layer_violations(all_imports())
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


def test_every_allowed_exception_is_still_there() -> None:
    edges = {(each.importer, each.imported) for each in all_imports()}
    stale = [f"{low} -> {high}" for low, high in ALLOWED if (low, high) not in edges]
    assert not stale, f"no longer imported, remove from ALLOWED: {stale}"


# the checks catch what they are for -----------------------------------------------------------------------------------
PLANTED = """
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fast_core.runtime.worker import Worker
"""


def test_a_type_only_import_counts_and_closes_a_cycle() -> None:
    imports = all_imports()
    known = {each.importer for each in imports}
    planted = list(module_imports("fast_core.model.flat", False, PLANTED, known, "fast_core/model/flat.py"))
    assert [(p.importer, p.imported, p.line) for p in planted] == [
        ("fast_core.model.flat", "fast_core.runtime.worker", 5)
    ]
    assert list(nx.simple_cycles(import_graph(imports + planted)))  # the worker imports flat: a cycle


def test_the_layer_check_names_an_upward_import_and_one_within_a_layer() -> None:
    imports = all_imports()
    known = {each.importer for each in imports}
    upward = list(module_imports("fast_core.observers.base", False, PLANTED, known, "fast_core/observers/base.py"))
    sideways = Import("fast_core.simulate.run", "fast_core.pipeline.grid", "fast_core/simulate/run.py", 3)
    assert layer_violations(imports + upward + [sideways]) == layer_violations(imports) + [
        "fast_core/observers/base.py:5: fast_core.observers.base imports fast_core.runtime.worker, a layer above it "
        "(observers: layer 7, runtime: layer 8)",
        "fast_core/simulate/run.py:3: fast_core.simulate.run imports fast_core.pipeline.grid, the same layer as it "
        "(simulate: layer 10, pipeline: layer 10)",
    ]
