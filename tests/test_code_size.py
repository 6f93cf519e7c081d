"""Size bounds of the storage wing (issue 30): no module over 600 lines, no function over 60
lines (its docstring left out). Complexity (over 15) is ruff's C901, in pyproject.toml."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORAGE = Path(__file__).resolve().parent.parent / "fsspec_shards" / "storage"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def function_lengths(source: str) -> dict[str, int]:
    """Each function's lines, from ``def`` to its last line, docstring left out; a method
    is named ``Class.method``, a nested function ``outer.inner``."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if ast.get_docstring(child, clean=False) is not None:
                        lines -= child.body[0].end_lineno - child.body[0].lineno + 1
                    lengths[name] = lines
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def storage_modules() -> list[Path]:
    return sorted(STORAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(STORAGE.parent).as_posix()


@pytest.mark.parametrize("path", storage_modules(), ids=_name)
def test_no_storage_module_is_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_name(path)}: {lines} lines"


@pytest.mark.parametrize("path", storage_modules(), ids=_name)
def test_no_storage_function_is_over_60_lines(path):
    lengths = function_lengths(path.read_text())
    assert {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES} == {}


def test_function_lengths_leave_the_docstring_out_and_name_methods_and_nested_functions():
    source = (
        "def f():\n"
        '    """Two\n    lines."""\n'
        "    x = 1\n"
        "    return x\n"
        "class C:\n"
        "    def m(self):\n"
        "        def inner():\n"
        "            pass\n"
        "        return inner\n"
    )
    assert function_lengths(source) == {"f": 3, "C.m": 4, "C.m.inner": 2}
