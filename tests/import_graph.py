"""The import graph of a package, read from its source with ``ast``: every ``import`` and
``from ... import`` counts, at module level, under ``if TYPE_CHECKING:`` and inside functions.

Run as a script for the cycles of ``fsspec_shards``: ``python tests/import_graph.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "fsspec_shards"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> Iterator[str]:
    """The dotted names ``module`` imports, relative imports resolved; ``from X import y``
    names ``X.y`` (which resolves to ``X`` when ``y`` is no module of its own)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a module imports its parents' ``__init__``
    too when it runs, but that edge is Python's, not the code's, so it is left out)."""
    modules = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def importers_of(graph: dict[str, set[str]], prefix: str) -> set[str]:
    """Modules outside ``prefix`` (a package) that import a module inside it."""

    def inside(name: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    return {
        module
        for module, targets in graph.items()
        if not inside(module) and any(inside(target) for target in targets)
    }


if __name__ == "__main__":
    graph = import_graph()
    for component in cycles(graph):
        print("cycle:", " <-> ".join(component))
    print("importers of cli:", sorted(importers_of(graph, f"{PACKAGE}.cli")))
