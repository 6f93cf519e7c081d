"""The package's import graph (every import: module level, ``TYPE_CHECKING``, inside
functions), read from the source by :mod:`tests.import_graph`."""

from __future__ import annotations

import textwrap

from tests.import_graph import PACKAGE, cycles, import_graph, importers_of

OWN_AREA = ("cli", "fleet", "distributed", "demo", "counters", "config", "errors", "redact")


def test_only_the_command_line_itself_imports_the_cli():
    assert importers_of(import_graph(), f"{PACKAGE}.cli") == {f"{PACKAGE}.__main__"}


def test_no_import_cycle_passes_through_the_cli_the_fleet_or_the_neutral_modules():
    prefixes = tuple(f"{PACKAGE}.{name}" for name in OWN_AREA)
    touching = [
        component
        for component in cycles(import_graph())
        if any(module.startswith(prefixes) for module in component)
    ]
    assert touching == []


def test_the_graph_sees_annotation_and_function_level_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.b import B
            """
        )
    )
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    graph = import_graph(package, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert importers_of(graph, "pkg.c") == {"pkg.b"}
