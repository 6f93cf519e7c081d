"""The cache counters are named once, and every cache reports each of them."""

from __future__ import annotations

import ast
from pathlib import Path

import fsspec

from fsspec_shards import counters
from fsspec_shards.storage import fetcher
from fsspec_shards.storage.cache import store


def test_the_cache_and_the_fetcher_count_by_the_one_definition():
    assert store.COUNTERS is counters.COUNTERS is fetcher.COUNTERS


COUNTING_CALLS = ("incr", "_count")
"""The methods the storage layer counts through (the cache, a download's target, the
fetcher, the shared tier)."""


def _counted_names() -> dict[str, set[str]]:
    """Every counter name written as a literal in a counting call, by module."""
    root = Path(counters.__file__).parent
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COUNTING_CALLS
                and node.args
            ):
                first = node.args[0]
                literals = [first] if isinstance(first, ast.Constant) else []
                if isinstance(first, ast.IfExp):  # "a" if ... else "b"
                    literals = [first.body, first.orelse]
                for literal in literals:
                    found.setdefault(str(path.relative_to(root)), set()).add(literal.value)
    return found


def test_every_counter_the_code_counts_is_one_the_definition_names():
    counted = _counted_names()
    known = set(counters.COUNTERS) | set(counters.SHARED_COUNTERS)
    unknown = {module: names - known for module, names in counted.items() if names - known}
    assert unknown == {}
    assert {"integrity_failures", "shared_evictions"} <= set().union(*counted.values())


def test_the_shared_tier_counters_are_reported_by_the_one_definition(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    fs = fsspec.filesystem(
        "wds",
        target_protocol="file",
        cache_dir=str(tmp_path / "c"),
        shared_cache_dir=str(tmp_path / "shared"),
        skip_instance_cache=True,
    )
    fs.cat_file(str(path))
    stats = fs.cache_stats()
    assert set(counters.SHARED_COUNTERS) <= set(stats)
    assert stats["shared_misses"] == 1


def test_every_counter_is_reported_with_the_cache_on_and_off(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    for cache in (True, False):
        fs = fsspec.filesystem(
            "wds", target_protocol="file", cache=cache, cache_dir=str(tmp_path / "c")
        )
        fs.cat_file(str(path))
        stats = fs.cache_stats()
        assert set(counters.COUNTERS) <= set(stats)
        assert stats["bytes_downloaded"] >= 100
