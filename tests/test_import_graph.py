"""The package's import graph (every import: module level, ``TYPE_CHECKING``, inside
functions), read from the source by :mod:`tests.import_graph`."""

from __future__ import annotations

import textwrap

import pytest

from tests.import_graph import PACKAGE, cycles, import_graph, importers_of, module_files

STORAGE = f"{PACKAGE}.storage"

STORAGE_LAYERS = {
    # folder of storage/ : the folders below it, which it may import (besides itself)
    "deps": (),
    "core": ("deps",),
    "backends": ("core", "deps"),
    "transfer": ("backends", "core", "deps"),
    "cache": ("transfer", "backends", "core", "deps"),
    "": ("cache", "transfer", "backends", "core", "deps"),  # the root: filesystem, files
}
"""The storage wing's layers, bottom first: a folder imports only folders below it."""

NEUTRAL = {
    f"{PACKAGE}.{name}"
    for name in (
        "checksums",
        "config",
        "counters",
        "errors",
        "exception_chain",
        "option_shapes",
        "redact",
        "shard_names",
        "tar_blocks",
        "units",
    )
}
"""Top-level modules any layer may import: vocabulary of the whole package, no layer's own."""

PUBLIC = {PACKAGE, STORAGE} | {
    f"{PACKAGE}.{name}"
    for name in ("checksums", "config", "counters", "errors", "option_shapes", "redact")
}
"""What the command line may take besides ``fleet/``: the names of ``fsspec_shards.__all__``
and of ``fsspec_shards.storage.__all__`` (never its folders), and the modules of what the
contract fixes (its errors, the options' sizes, the manifest format, the stats keys, the
shapes storage options come in, the redacted display)."""


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _storage_folder(module: str) -> str:
    """The layer folder of a storage module (``""`` for the root's own modules)."""
    rest = module[len(STORAGE) + 1 :].split(".") if module != STORAGE else []
    is_package = module_files()[module].name == "__init__.py"
    return rest[0] if len(rest) > 1 or (rest and is_package) else ""


def _edges_from(prefix: str) -> list[tuple[str, str]]:
    graph = import_graph()
    return sorted(
        (module, target)
        for module, targets in graph.items()
        if _inside(module, prefix)
        for target in targets
    )


def test_every_storage_folder_is_a_layer_of_the_table():
    folders = {_storage_folder(module) for module in import_graph() if _inside(module, STORAGE)}
    assert folders == set(STORAGE_LAYERS)


def test_storage_folders_import_only_the_layers_below_them():
    wrong = [
        (module, target)
        for module, target in _edges_from(STORAGE)
        if _inside(target, STORAGE)
        and (below := _storage_folder(target)) != _storage_folder(module)
        and below not in STORAGE_LAYERS[_storage_folder(module)]
    ]
    assert wrong == []


def test_storage_imports_of_the_package_are_neutral_modules():
    wrong = [
        (module, target)
        for module, target in _edges_from(STORAGE)
        if not _inside(target, STORAGE) and target not in NEUTRAL
    ]
    assert wrong == []


def test_neutral_modules_import_only_neutral_modules():
    graph = import_graph()
    assert {module: graph[module] - NEUTRAL for module in NEUTRAL} == {
        module: set() for module in NEUTRAL
    }


def test_the_cli_imports_only_fleet_and_public_names():
    wrong = [
        (module, target)
        for module, target in _edges_from(f"{PACKAGE}.cli")
        if not _inside(target, f"{PACKAGE}.cli")
        and not _inside(target, f"{PACKAGE}.fleet")
        and target not in PUBLIC
    ]
    assert wrong == []


def test_fleet_takes_of_storage_only_its_public_names():
    wrong = [
        (module, target)
        for module, target in _edges_from(f"{PACKAGE}.fleet")
        if _inside(target, STORAGE) and target != STORAGE
    ]
    assert wrong == []


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
