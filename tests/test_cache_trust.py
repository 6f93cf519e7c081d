"""The cache's trust boundary and its degraded modes, with real other users, real planted
index rows, real read-only mounts and real planted files (a corrupt index:
test_cache_index_database.py).

Adopting a cache directory an earlier layout format made
(:mod:`fsspec_shards.storage.cache.trust`): format 1 serves none of its entries, format 2
keeps the entries that check out, and an adoption cut short is finished by the next
process.
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from fsspec_shards.storage.backends import KEY_FORMAT
from fsspec_shards.storage.cache import (
    CacheDirectoryError,
    CacheWarning,
    NotACacheError,
    ReadOnlyCacheError,
    ShardCache,
    layout,
)
from tests import cache_objects
from tests.cache_objects import as_a_new_process, fill, obj, payload, plant_row, tree, writer

read_only_view = cache_objects.read_only_view  # the fixture, for the tests below

OTHER_UID = 12345


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """Each test opens its caches as a new process would (no shared index from before)."""
    as_a_new_process()
    yield
    as_a_new_process()


def plant_entry(cache: ShardCache, url: str, file: str, size: int, accessed_at: float = 0) -> None:
    """Insert an entry the way another program would: straight into the database."""
    record = {"file": file, "size": size, "shown": url, "stored_at": 0, "metadata": {}}
    plant_row(cache.directory, f"entry:{obj(url).key}", json.dumps(record), size, accessed_at)


def index_keys(cache: ShardCache) -> list[str]:
    return [key for key, _, _ in cache_objects.indexed_entries(cache.directory)]


# -- a new cache, and which existing directories are used -------------------------------------


def test_a_new_cache_directory_is_private_and_marked_with_its_format(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "parent" / "cache"), 1000)
    root = Path(cache.directory)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    marker = json.loads((root / layout.MARKER).read_text())
    assert marker["format"] == layout.FORMAT and "adopting" not in marker


def test_an_empty_existing_directory_is_taken_and_marked(tmp_path: Path) -> None:
    directory = tmp_path / "empty"
    directory.mkdir(mode=0o755)
    fill(ShardCache(str(directory), 1000), "s3://bucket/a")
    assert (directory / layout.MARKER).is_file()


def test_a_directory_with_other_files_is_refused_and_left_untouched(tmp_path: Path) -> None:
    directory = tmp_path / "photos"
    (directory / "files").mkdir(parents=True)
    (directory / "files" / "holiday.jpg").write_bytes(b"jpeg")
    (directory / "tmp").mkdir()
    (directory / "tmp" / "draft.part").write_bytes(b"draft")
    before = tree(directory)
    with pytest.raises(CacheDirectoryError) as raised:
        ShardCache(str(directory), 1000)
    message = str(raised.value)
    assert str(directory) in message and "not a fsspec-shards cache" in message
    assert "cache_dir" in message  # how to fix it
    assert tree(directory) == before


def test_a_file_given_as_the_cache_directory_is_refused_and_kept(tmp_path: Path) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    with pytest.raises(CacheDirectoryError, match="is not a directory"):
        ShardCache(str(plain), 1000)
    with pytest.raises(NotACacheError, match="is not a directory"):
        ShardCache.existing(str(plain))
    assert plain.read_text() == "mine"


def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    fill(cache, "s3://bucket/a")
    as_a_new_process()
    os.chown(cache.directory, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheDirectoryError) as raised:
        ShardCache(cache.directory, 1000)
    assert f"owned by uid {OTHER_UID}" in str(raised.value)
    assert cache.directory in str(raised.value)


def test_a_directory_another_user_planted_empty_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "planted"
    directory.mkdir(mode=0o777)
    os.chmod(directory, 0o777)
    os.chown(directory, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheDirectoryError, match=f"owned by uid {OTHER_UID}"):
        ShardCache(str(directory), 1000)
    assert list(directory.iterdir()) == []


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_directory_writable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    os.chmod(cache.directory, mode)
    with pytest.raises(CacheDirectoryError) as raised:
        ShardCache(cache.directory, 1000)
    assert "writable by group or others" in str(raised.value)
    assert "chmod" not in str(raised.value)  # never advice to change a directory others use
    assert "directory of your own" in str(raised.value)


def _sticky(path: Path) -> Path:
    """A real sticky, world-writable directory, as /tmp and /dev/shm are."""
    path.mkdir()
    os.chmod(path, 0o1777)
    assert os.stat(path).st_mode & stat.S_ISVTX
    return path


def test_a_sticky_shared_directory_holds_the_cache_in_a_private_one_of_this_user(
    tmp_path: Path,
) -> None:
    shared = _sticky(tmp_path / "tmp")
    cache = ShardCache(str(shared), 1000)
    private = shared / f"fsspec-shards-{os.geteuid()}"
    assert cache.directory == str(private)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert (private / layout.MARKER).is_file()
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777  # the shared one is left alone
    fill(cache, "s3://b/k.tar")
    as_a_new_process()
    assert ShardCache(str(shared), 1000).directory == str(private)


def test_inspecting_a_sticky_directory_looks_at_the_private_one_and_writes_nothing(
    tmp_path: Path,
) -> None:
    shared = _sticky(tmp_path / "tmp")
    with pytest.raises(NotACacheError) as raised:
        ShardCache(str(shared), 1000, create=False)
    assert raised.value.kind == "missing"
    assert f"fsspec-shards-{os.geteuid()}" in str(raised.value)
    assert list(shared.iterdir()) == []


def test_a_private_directory_another_user_planted_in_a_sticky_one_is_refused(
    tmp_path: Path,
) -> None:
    shared = _sticky(tmp_path / "tmp")
    planted = shared / f"fsspec-shards-{os.geteuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheDirectoryError) as raised:
        ShardCache(str(shared), 1000)
    message = str(raised.value)
    assert f"owned by uid {OTHER_UID}" in message and "chmod" not in message
    assert "directory of your own (such as" in message
    assert list(planted.iterdir()) == []


def test_a_symlink_planted_as_the_private_directory_is_refused(tmp_path: Path) -> None:
    shared = _sticky(tmp_path / "tmp")
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir(mode=0o700)
    (shared / f"fsspec-shards-{os.geteuid()}").symlink_to(elsewhere)
    with pytest.raises(CacheDirectoryError, match="is a symlink"):
        ShardCache(str(shared), 1000)
    assert list(elsewhere.iterdir()) == []


def test_the_wds_filesystem_given_a_sticky_directory_caches_in_the_private_one(
    tmp_path: Path,
) -> None:
    shared = _sticky(tmp_path / "shm")
    (tmp_path / "a.bin").write_bytes(b"abc")
    fs = fsspec.filesystem(
        "wds", target_protocol="file", cache_dir=str(shared), skip_instance_cache=True
    )
    assert fs.cat_file(str(tmp_path / "a.bin")) == b"abc"
    stats = fs.cache_stats()
    assert stats["directory"] == str(shared / f"fsspec-shards-{os.geteuid()}")
    assert stats["cached_files"] == 1


def test_a_files_directory_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    """The attack of the issue: another user's 0777 files/ lets them swap cached bytes."""
    directory = tmp_path / "cache"
    ShardCache(str(directory), 1000)
    as_a_new_process()
    files = directory / "files"
    files.rmdir()
    files.mkdir()
    os.chmod(files, 0o777)
    os.chown(files, OTHER_UID, OTHER_UID)
    with pytest.raises(CacheDirectoryError) as raised:
        ShardCache(str(directory), 1000)
    assert str(files) in str(raised.value)


def test_a_subdirectory_replaced_by_a_symlink_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    ShardCache(str(directory), 1000)
    as_a_new_process()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (directory / "tmp").rmdir()
    (directory / "tmp").symlink_to(elsewhere)
    with pytest.raises(CacheDirectoryError, match="is a symlink"):
        ShardCache(str(directory), 1000)


def test_a_data_subdirectory_that_is_a_symlink_is_never_followed(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    url = "s3://bucket/a"
    path = Path(fill(cache, url))
    as_a_new_process()
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / path.name).write_bytes(payload(url, 100))
    path.unlink()
    path.parent.rmdir()
    path.parent.symlink_to(outside)
    cache = ShardCache(cache.directory, 1000)
    with pytest.warns(CacheWarning, match="not a file this cache made"):
        assert cache.open(obj(url)) is None
    cache.clear()
    assert (outside / path.name).read_bytes() == payload(url, 100)


def test_an_index_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    as_a_new_process()
    os.chown(os.path.join(cache.directory, layout.INDEX), OTHER_UID, OTHER_UID)
    with pytest.raises(CacheDirectoryError, match=layout.INDEX):
        ShardCache(cache.directory, 1000)


def test_an_index_made_readable_by_others_is_made_private_again(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    index = Path(cache.directory) / layout.INDEX
    os.chmod(index, 0o644)
    ShardCache(cache.directory, 1000)
    assert stat.S_IMODE(index.stat().st_mode) == 0o600


def test_a_cache_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    marker = Path(cache.directory) / layout.MARKER
    marker.write_text(json.dumps({"format": layout.FORMAT + 1}))
    with pytest.raises(CacheDirectoryError, match="layout format"):
        ShardCache(cache.directory, 1000)


# -- the index names only the cache's own files -------------------------------------------


def test_a_planted_index_row_naming_a_file_outside_is_ignored_never_opened_or_deleted(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "home" / "victim" / "secret.txt"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"the victim's own file")
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    url = "s3://bucket/a"
    relative = os.path.relpath(victim, Path(cache.directory) / "files" / "ab")
    plant_entry(cache, url, f"files/ab/{relative}", victim.stat().st_size)
    plant_entry(cache, "s3://bucket/b", str(victim), victim.stat().st_size)
    with pytest.warns(CacheWarning) as caught:
        assert cache.open(obj(url)) is None
        assert cache.open(obj("s3://bucket/b")) is None
    assert all(cache.directory in str(w.message) for w in caught)
    assert any("not a file this cache made" in str(w.message) for w in caught)
    assert index_keys(cache) == []  # the rows are dropped, the file is not touched
    assert victim.read_bytes() == b"the victim's own file"
    assert Path(fill(cache, url)).read_bytes() == payload(url, 100)  # and the key works again


def test_eviction_discard_and_clear_never_delete_what_a_planted_row_names(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me")
    cache = ShardCache(str(tmp_path / "cache"), 250)
    plant_entry(cache, "s3://bucket/evicted", f"files/../../{victim.name}", 100, accessed_at=0)
    plant_entry(cache, "s3://bucket/discarded", f"files/../../{victim.name}", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        fill(cache, "s3://bucket/a")
        fill(cache, "s3://bucket/b")  # needs room: evicts the planted least-recent row
        cache.discard(obj("s3://bucket/discarded"))
        plant_entry(cache, "s3://bucket/cleared", str(victim), 1)
        cache.clear()
    assert victim.read_bytes() == b"keep me"
    assert index_keys(cache) == []


class _MakesADirectory:
    """Unpickling this makes a directory: the proof that a value was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_rows_diskcache_would_unpickle_open_or_delete_are_data_never_followed(
    tmp_path: Path,
) -> None:
    """diskcache unpickles a row of mode 4 and opens (and on delete, unlinks) the value
    file a row names: the index's serializer does none of it."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"keep me")
    unpickled = tmp_path / "unpickled"
    cache = ShardCache(str(tmp_path / "cache"), 150)
    pickled, named = obj("s3://bucket/pickled").key, obj("s3://bucket/named").key
    payload_pickle = pickle.dumps(_MakesADirectory(unpickled))
    plant_row(cache.directory, f"entry:{pickled}", payload_pickle, 100, mode=4)
    plant_row(cache.directory, f"generation:{pickled}", payload_pickle, 0, mode=4)
    relative = os.path.relpath(victim, cache.directory)
    plant_row(cache.directory, f"entry:{named}", None, 100, mode=2, filename=relative)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        for url in ("s3://bucket/pickled", "s3://bucket/named"):
            assert cache.open(obj(url)) is None and cache.metadata(obj(url)) is None
            assert cache.generation(obj(url)) == 0
        assert cache.stats()["cached_bytes"] == 200
        fill(cache, "s3://bucket/a")  # needs room: evicts the planted rows, least recent first
        assert index_keys(cache) == [obj("s3://bucket/a").key]
        plant_row(cache.directory, f"entry:{named}", None, 1, mode=2, filename=relative)
        cache.discard(obj("s3://bucket/named"))
        plant_row(cache.directory, f"entry:{named}", None, 1, mode=2, filename=relative)
        cache.clear()
    assert victim.read_bytes() == b"keep me" and not unpickled.exists()
    assert index_keys(cache) == [] and cache.stats()["cached_bytes"] == 0


def test_a_row_naming_another_keys_file_is_not_served(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    other = Path(fill(cache, "s3://bucket/other"))
    plant_entry(cache, "s3://bucket/a", str(other.relative_to(cache.directory)), 100)
    with pytest.warns(CacheWarning, match="not a file this cache made"):
        assert cache.open(obj("s3://bucket/a")) is None
    assert other.read_bytes() == payload("s3://bucket/other", 100)


def test_a_cached_file_swapped_for_a_symlink_is_a_miss(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    url = "s3://bucket/a"
    path = Path(fill(cache, url))
    planted = tmp_path / "planted"
    planted.write_bytes(b"x" * 100)
    path.unlink()
    path.symlink_to(planted)
    assert cache.open(obj(url)) is None
    assert planted.read_bytes() == b"x" * 100
    assert Path(fill(cache, url)).read_bytes() == payload(url, 100)


def test_a_cached_file_owned_by_another_user_is_a_miss(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    url = "s3://bucket/a"
    os.chown(fill(cache, url), OTHER_UID, OTHER_UID)
    assert cache.open(obj(url)) is None


# -- the cache deletes only files it made --------------------------------------------------


def test_clear_and_stale_temp_clean_up_delete_only_names_the_cache_makes(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    ours = [Path(fill(cache, f"s3://bucket/{n}")) for n in "ab"]
    root = Path(cache.directory)
    foreign = [
        root / "files" / "notes.txt",
        root / "files" / ours[0].parent.name / "keep.bin",
        root / "tmp" / "draft.part",
        root / "tmp" / "unrelated.txt",
    ]
    for path in foreign:
        path.write_bytes(b"not the cache's")
    stale = root / "tmp" / f"{obj('s3://bucket/dead').key}.999999.deadbeef.10.part"
    stale.write_bytes(b"partial")
    fill(cache, "s3://bucket/c")  # reserving room sweeps stale temp files
    assert not stale.exists()
    cache.clear()
    assert not any(path.exists() for path in ours)
    assert all(path.read_bytes() == b"not the cache's" for path in foreign)


def test_the_first_read_keeps_temp_files_the_cache_did_not_make(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    ShardCache(str(directory), 1000)
    precious = directory / "tmp" / "precious.part"
    precious.write_bytes(b"mine")
    as_a_new_process()
    fill(ShardCache(str(directory), 1000), "s3://bucket/a")
    assert precious.read_bytes() == b"mine"


# -- inspection creates nothing ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "empty", "foreign"])
def test_inspecting_a_directory_that_is_not_a_cache_says_so_and_creates_nothing(
    tmp_path: Path, kind: str
) -> None:
    directory = tmp_path / "plain"
    if kind != "missing":
        directory.mkdir()
    if kind == "foreign":
        (directory / "data.csv").write_text("a,b\n")
    before = tree(tmp_path)
    with pytest.raises(NotACacheError) as raised:
        ShardCache.existing(str(directory))
    assert str(directory) in str(raised.value)
    assert isinstance(raised.value, OSError)
    assert tree(tmp_path) == before


def test_inspecting_a_cache_reads_it_and_writes_nothing(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), 1000)
    fill(cache, "s3://bucket/a")
    cache.flush()
    as_a_new_process()
    before = tree(Path(cache.directory))
    inspected = ShardCache.existing(cache.directory)
    assert [e["url"] for e in inspected.entries()] == ["s3://bucket/a"]
    assert inspected.stats()["cached_files"] == 1
    assert inspected.get(obj("s3://bucket/a")) is not None
    with pytest.raises(ReadOnlyCacheError):
        inspected.clear()
    inspected.flush()
    assert tree(Path(cache.directory)) == before


# -- degraded modes: read-only, unusable, corrupt -------------------------------------------


def test_a_read_only_cache_serves_its_entries_and_streams_misses_with_one_warning(
    tmp_path: Path, read_only_view
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    cached, missing = source / "cached.bin", source / "missing.bin"
    cached.write_bytes(payload("cached", 5000))
    missing.write_bytes(payload("missing", 7000))
    options = {"target_protocol": "file", "skip_instance_cache": True}
    writable = fsspec.filesystem("wds", cache_dir=str(tmp_path / "cache"), **options)
    assert writable.cat_file(str(cached)) == payload("cached", 5000)
    writable.shard_cache.flush()
    as_a_new_process()
    view = read_only_view(tmp_path / "cache")
    before = tree(tmp_path / "cache")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fs = fsspec.filesystem("wds", cache_dir=str(view), **options)
        for _ in range(3):
            with fs.open(str(cached), "rb") as handle:
                assert handle.read() == payload("cached", 5000)
                assert handle.name.startswith(str(view))  # served from the cache
            assert fs.cat_file(str(missing)) == payload("missing", 7000)
            with fs.open(str(missing), "rb") as handle:
                assert handle.read() == payload("missing", 7000)
        fs.pipe_file(str(cached), b"new bytes")  # a write cannot drop the read-only copy ...
        assert fs.cat_file(str(cached)) == b"new bytes"  # ... but this process stops serving it
        stats = fs.cache_stats()
    cache_warnings = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert [str(view) in str(w.message) for w in cache_warnings] == [True, True]
    assert "read-only" in str(cache_warnings[0].message)
    assert stats["hits"] == 3 and stats["cached_files"] == 1
    assert tree(tmp_path / "cache") == before


def test_a_cache_directory_that_cannot_be_created_streams_everything_with_one_warning(
    tmp_path: Path, read_only_view
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.bin").write_bytes(payload("a", 3000))
    empty = tmp_path / "empty"
    empty.mkdir()
    view = read_only_view(empty)
    fs = fsspec.filesystem(
        "wds", target_protocol="file", cache_dir=str(view / "cache"), skip_instance_cache=True
    )
    with pytest.warns(CacheWarning, match="cannot be created") as caught:
        for _ in range(3):
            assert fs.cat_file(str(source / "a.bin")) == payload("a", 3000)
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert fs.cache_stats()["bytes_downloaded"] == 3 * 3000


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
