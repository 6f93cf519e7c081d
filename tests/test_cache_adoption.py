"""Adopting a cache directory an earlier layout format made
(:mod:`fsspec_shards.storage.cache.adoption`): format 1 serves none of its entries, format 2
keeps the entries that check out, and an adoption cut short is finished by the next
process. Moved from tests/test_cache_trust.py, which covers the trust boundary."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsspec_shards.storage.backends import KEY_FORMAT
from fsspec_shards.storage.cache import NotACacheError, ShardCache, layout
from tests import cache_objects
from tests.cache_objects import as_a_new_process, fill, obj, payload, tree, writer


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """Each test opens its caches as a new process would (no shared index from before)."""
    as_a_new_process()
    yield
    as_a_new_process()


def make_previous_layout(directory: Path) -> dict[str, Path]:
    """A cache as the diskcache-based version left it: index, files, temp, state, locks."""
    import diskcache

    directory.mkdir(mode=0o700)
    key = "ab" + "0" * 62
    data = directory / "files" / "ab" / f"{key}.0badf00d"
    data.parent.mkdir(parents=True, mode=0o700)
    data.write_bytes(b"bytes the old version cached")
    index = diskcache.Cache(str(directory))
    index.set(key, json.dumps({"url": "s3://bucket/old", "file": f"files/ab/{data.name}"}))
    index.close()
    for name in ("counters", "validated"):
        state = diskcache.Cache(str(directory / "state" / name))
        state.set("hits", 3)
        state.close()
    (directory / "tmp").mkdir(mode=0o700)
    temp = directory / "tmp" / f"{key}.123.deadbeef.10.part"
    temp.write_bytes(b"partial")
    (directory / "locks").mkdir(mode=0o700)
    lock = directory / "locks" / f"{key}.lock"
    lock.write_bytes(b"")
    foreign = directory / "files" / "ab" / "user-notes.txt"
    foreign.write_bytes(b"not the cache's")
    return {"data": data, "temp": temp, "lock": lock, "foreign": foreign}


def old_index_rows(directory: Path) -> list[tuple]:
    """Rows of the index that the current index would never write (the old index's)."""
    return [
        row
        for row in cache_objects.index_query(str(directory), "SELECT key FROM Cache")
        if not row[0].startswith(("entry:", "generation:", "counter:", "key_format", "size_limit"))
    ]


def test_a_cache_of_the_previous_layout_is_adopted_and_serves_none_of_its_entries(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "old"
    paths = make_previous_layout(directory)
    with pytest.raises(NotACacheError, match="earlier fsspec-shards version"):
        ShardCache.existing(str(directory))
    cache = ShardCache(str(directory), 1000)
    assert json.loads((directory / layout.MARKER).read_text())["format"] == layout.FORMAT
    assert not paths["data"].exists() and not paths["temp"].exists()
    assert not (directory / "state").exists()
    assert old_index_rows(directory) == []  # cache.db is a new index: the old one is gone
    assert paths["lock"].exists() and paths["foreign"].read_bytes() == b"not the cache's"
    assert cache.entries() == [] and cache.stats()["hits"] == 0
    assert Path(fill(cache, "s3://bucket/old")).read_bytes() == payload("s3://bucket/old", 100)


def test_an_adoption_cut_short_is_finished_by_the_next_process(tmp_path: Path) -> None:
    directory = tmp_path / "old"
    paths = make_previous_layout(directory)
    (directory / layout.MARKER).write_text(json.dumps({"format": layout.FORMAT, "adopting": 1}))
    os.chmod(directory / layout.MARKER, 0o600)
    cache = ShardCache(str(directory), 1000)
    assert "adopting" not in json.loads((directory / layout.MARKER).read_text())
    assert not paths["data"].exists() and old_index_rows(directory) == []
    assert cache.entries() == []


FORMAT_2_SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE entries (key TEXT PRIMARY KEY, file TEXT NOT NULL, size INTEGER NOT NULL, "
    "shown TEXT NOT NULL, stored_at REAL NOT NULL, accessed_at REAL NOT NULL, "
    "validated_at REAL NOT NULL, metadata TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE generations (key TEXT PRIMARY KEY, generation INTEGER NOT NULL)",
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


def make_format_2_cache(directory: Path, key_format: str = KEY_FORMAT) -> dict[str, Path]:
    """A cache as the own-SQLite-index version (layout format 2) left it: two whole entries,
    one whose file is short, one naming a file outside, an unindexed file, a temp file."""
    directory.mkdir(mode=0o700)
    for name in layout.SUBDIRECTORIES:
        (directory / name).mkdir(mode=0o700)
    marker = {"format": 2, "made_by": "fsspec-shards", "tier": "local"}
    (directory / layout.MARKER).write_text(json.dumps(marker))
    os.chmod(directory / layout.MARKER, 0o600)
    victim = directory.parent / "victim.txt"
    victim.write_bytes(b"keep me")
    paths = {"victim": victim}
    index = sqlite3.connect(directory / "index.db")
    for statement in FORMAT_2_SCHEMA:
        index.execute(statement)
    index.execute("INSERT INTO meta VALUES ('format', '2'), ('key_format', ?)", (key_format,))
    rows = [("older", 100, 100, 10), ("kept", 100, 100, 20), ("short", 100, 50, 30)]
    for name, recorded, actual, accessed in rows:
        key = obj(f"s3://bucket/{name}").key
        data = directory / "files" / key[:2] / f"{key}.0badf00d"
        data.parent.mkdir(mode=0o700, exist_ok=True)
        data.write_bytes(payload(f"s3://bucket/{name}", actual))
        relative = str(data.relative_to(directory))
        metadata = json.dumps({"identity": f"etag-{name}"})
        index.execute(
            "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key, relative, recorded, f"s3://bucket/{name}", 1.0, accessed, 2.0, metadata),
        )
        paths[name] = data
    outside = obj("s3://bucket/outside").key
    index.execute(
        "INSERT INTO entries VALUES (?, ?, 7, 's3://bucket/outside', 0, 0, 0, '{}')",
        (outside, f"files/{outside[:2]}/../../../victim.txt"),
    )
    index.execute("INSERT INTO generations VALUES (?, 3)", (obj("s3://bucket/kept").key,))
    index.execute("INSERT INTO counters VALUES ('hits', 7)")
    index.commit()
    index.close()
    unindexed = obj("s3://bucket/unindexed").key
    paths["unindexed"] = directory / "files" / unindexed[:2] / f"{unindexed}.12345678"
    paths["unindexed"].parent.mkdir(mode=0o700, exist_ok=True)
    paths["unindexed"].write_bytes(b"left by a killed process")
    paths["temp"] = directory / "tmp" / f"{unindexed}.123.deadbeef.10.part"
    paths["temp"].write_bytes(b"partial")
    paths["foreign"] = directory / "files" / "user-notes.txt"
    paths["foreign"].write_bytes(b"not the cache's")
    return paths


def test_a_cache_of_format_2_is_adopted_keeping_the_entries_that_check_out(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "own-index"
    paths = make_format_2_cache(directory)
    before = tree(directory)
    with pytest.raises(NotACacheError, match="earlier fsspec-shards version") as raised:
        ShardCache.existing(str(directory))
    assert raised.value.kind == "previous" and tree(directory) == before
    cache = ShardCache(str(directory), 1000)
    marker = json.loads((directory / layout.MARKER).read_text())
    assert marker["format"] == layout.FORMAT and "adopting" not in marker
    assert not (directory / "index.db").exists()
    assert cache.stats()["hits"] == 7 and cache.generation(obj("s3://bucket/kept")) == 3
    assert [e["url"] for e in cache.entries()] == ["s3://bucket/older", "s3://bucket/kept"]
    with cache.fetch(obj("s3://bucket/kept"), writer(b"never downloaded")) as handle:
        assert handle.read() == payload("s3://bucket/kept", 100)
    assert cache.metadata(obj("s3://bucket/kept"))["identity"] == "etag-kept"
    assert cache.open(obj("s3://bucket/short")) is None and not paths["short"].exists()
    assert cache.open(obj("s3://bucket/outside")) is None
    assert paths["victim"].read_bytes() == b"keep me"
    assert not paths["unindexed"].exists() and not paths["temp"].exists()
    assert paths["foreign"].read_bytes() == b"not the cache's"


def test_a_cache_of_format_2_under_another_key_format_serves_none_of_its_entries(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "own-index"
    paths = make_format_2_cache(directory, key_format="fsspec-shards-key-v1")
    cache = ShardCache(str(directory), 1000)
    assert cache.entries() == [] and cache.generation(obj("s3://bucket/kept")) == 0
    assert not any(paths[name].exists() for name in ("older", "kept", "short", "unindexed"))
    assert paths["foreign"].exists() and paths["victim"].read_bytes() == b"keep me"
    assert Path(fill(cache, "s3://bucket/kept")).read_bytes() == payload("s3://bucket/kept", 100)


def test_an_adoption_of_format_2_cut_short_is_finished_by_the_next_process(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "own-index"
    paths = make_format_2_cache(directory)
    marker = {"format": layout.FORMAT, "tier": "local", "adopting": 2}
    (directory / layout.MARKER).write_text(json.dumps(marker))
    cache = ShardCache(str(directory), 1000)
    assert "adopting" not in json.loads((directory / layout.MARKER).read_text())
    assert [e["url"] for e in cache.entries()] == ["s3://bucket/older", "s3://bucket/kept"]
    assert not (directory / "index.db").exists() and not paths["unindexed"].exists()
