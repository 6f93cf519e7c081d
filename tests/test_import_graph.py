"""The package's import graph (every import: module level, ``TYPE_CHECKING``, inside
functions), read from the source by :mod:`tests.import_graph`."""

from __future__ import annotations

import textwrap

import pytest

from tests.import_graph import PACKAGE, cycles, import_graph, importers_of


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_only_the_command_line_itself_imports_the_cli():
    assert importers_of(import_graph(), f"{PACKAGE}.cli") == {f"{PACKAGE}.__main__"}


def test_no_import_cycle_anywhere():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(("layer", "other"), [("storage", "iteration"), ("iteration", "storage")])
def test_storage_and_iteration_never_import_each_other(layer, other):
    graph = import_graph()
    importers = {
        module
        for module in importers_of(graph, f"{PACKAGE}.{other}")
        if _inside(module, f"{PACKAGE}.{layer}")
    }
    assert importers == set()


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
