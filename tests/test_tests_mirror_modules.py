"""Tests mirror modules: every module of ``fsspec_shards`` has a test file of its own.

Module ``fsspec_shards/<dirs>/<name>.py`` is tested by ``tests/<d>/test_<name>.py`` for
``<d>`` any tail of ``<dirs>`` or none (``tests/test_tar.py``, ``tests/backends/test_s3.py``),
but only under ``tests/<dir>/`` when its first directory has one (``tests/cli/test_verify.py``),
by ``tests/test_<last dir>_<name>.py`` (``tests/test_cache_shared.py``), or by
``tests/integration/test_<name>.py`` (real servers).
Packages' ``__init__`` modules are left out. Run as a script to list the modules without one.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fsspec_shards"
TESTS = ROOT / "tests"

ALIASES = {"storage/cache/store.py": "test_cache.py"}
"""Modules whose tests carry the name of what the module is: the cache itself."""


def candidate_test_files(module: Path) -> list[Path]:
    """Where the tests of ``module`` (relative to the package) may live."""
    if module.as_posix() in ALIASES:
        return [TESTS / ALIASES[module.as_posix()]]
    dirs = module.parent.parts
    name = f"test_{module.stem}.py"
    own_directory = bool(dirs) and (TESTS / dirs[0]).is_dir()
    tails = range(len(dirs) if own_directory else len(dirs) + 1)
    candidates = [TESTS.joinpath(*dirs[first:], name) for first in tails]
    if dirs and not own_directory:
        candidates.append(TESTS / f"test_{dirs[-1]}_{module.stem}.py")
    candidates.append(TESTS / "integration" / name)
    return candidates


def untested_modules() -> set[str]:
    """The package's modules (``__init__`` left out) for which no test file exists."""
    return {
        module.as_posix()
        for module in (path.relative_to(PACKAGE) for path in sorted(PACKAGE.rglob("*.py")))
        if module.name != "__init__.py"
        and module.name != "__main__.py"
        and not any(path.exists() for path in candidate_test_files(module))
    }


def test_every_module_has_a_test_file_of_its_own():
    assert sorted(untested_modules()) == []


def test_the_rule_finds_the_files_of_every_layout():
    def finds(module: str, test: str) -> bool:
        return TESTS / test in candidate_test_files(Path(module))

    assert finds("iteration/tar.py", "test_tar.py")
    assert finds("cli/verify.py", "cli/test_verify.py")
    assert finds("storage/backends/s3.py", "backends/test_s3.py")
    assert finds("storage/cache/shared.py", "test_cache_shared.py")
    assert finds("distributed.py", "integration/test_distributed.py")
    assert not finds("cli/errors.py", "test_errors.py")  # that one tests errors.py


if __name__ == "__main__":
    for module in sorted(untested_modules()):
        print("no test file:", module)
