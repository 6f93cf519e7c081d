"""The shared cache tier, through ``wds`` on local files: lookups before the backend,
publication, checks on the way out, its own cap and LRU, trust and degraded modes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from fsspec_shards.checksums import BlockHasher, Checksum, format_block_manifest, format_sums
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.cache import CacheDirectoryError, CacheWarning, ShardCache, layout, locks
from fsspec_shards.storage.cache import shared as shared_module
from fsspec_shards.storage.cache.shared import SharedTier
from tests import cache_objects
from tests.cache_objects import obj, payload
from tests.hostile_user import NOBODY, as_other_user

read_only_view = cache_objects.read_only_view  # the fixture, for the tests below


def shared_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (directory / "files").rglob("*") if p.is_file()}


def wds(tmp_path: Path, host: str, shared: Path, **options) -> fsspec.AbstractFileSystem:
    """A "host": its own local cache, the common shared tier."""
    return fsspec.filesystem(
        "wds",
        target_protocol="file",
        cache_dir=str(tmp_path / f"local-{host}"),
        shared_cache_dir=str(shared),
        skip_instance_cache=True,
        **options,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    directory = tmp_path / "source"
    directory.mkdir()
    for index in range(3):
        (directory / f"shard-{index}.tar").write_bytes(payload(f"shard-{index}", 50_000))
    return directory


def test_a_second_host_reads_from_the_shared_tier_not_the_backend(
    tmp_path: Path, source: Path
) -> None:
    shared = tmp_path / "shared"
    one, two = wds(tmp_path, "one", shared), wds(tmp_path, "two", shared)
    for index in range(3):
        path = str(source / f"shard-{index}.tar")
        assert one.cat_file(path) == payload(f"shard-{index}", 50_000)
        assert two.cat_file(path) == payload(f"shard-{index}", 50_000)
    first, second = one.cache_stats(), two.cache_stats()
    assert (first["shared_misses"], first["shared_hits"], first["bytes_downloaded"]) == (
        3,
        0,
        150_000,
    )
    assert (second["shared_misses"], second["shared_hits"], second["bytes_downloaded"]) == (
        3 - 3,
        3,
        0,
    )
    assert second["misses"] == 3 and second["cached_files"] == 3  # now in two's local tier too
    assert sorted(shared_files(shared).values()) == sorted(
        payload(f"shard-{i}", 50_000) for i in range(3)
    )
    marker = json.loads((shared / layout.MARKER).read_text())
    assert marker["tier"] == "shared" and marker["format"] == layout.FORMAT


def test_a_replaced_object_gets_a_new_shared_copy_and_the_old_one_is_never_served(
    tmp_path: Path, source: Path
) -> None:
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    wds(tmp_path, "one", shared).cat_file(str(path))
    path.write_bytes(b"the new version of the shard")
    two = wds(tmp_path, "two", shared)
    assert two.cat_file(str(path)) == b"the new version of the shard"
    assert two.cache_stats()["shared_hits"] == 0
    assert b"the new version of the shard" in shared_files(shared).values()


def test_a_shared_copy_that_fails_its_checksum_is_replaced_from_the_backend(
    tmp_path: Path, source: Path
) -> None:
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    good = path.read_bytes()
    checksums = {str(path): "sha256:" + hashlib.sha256(good).hexdigest()}
    wds(tmp_path, "one", shared, checksums=checksums).cat_file(str(path))
    [copy] = [p for p in (shared / "files").rglob("*") if p.is_file()]
    copy.chmod(0o600)
    damaged = bytearray(copy.read_bytes())
    damaged[100] ^= 0xFF
    copy.write_bytes(bytes(damaged))  # same size: only the checksum can tell
    two = wds(tmp_path, "two", shared, checksums=checksums)
    assert two.cat_file(str(path)) == good
    stats = two.cache_stats()
    assert (stats["shared_hits"], stats["bytes_downloaded"], stats["integrity_failures"]) == (
        0,
        len(good),
        1,
    )
    assert shared_files(shared) == {copy.name: good}


def test_a_shared_copy_of_the_wrong_size_is_ignored(tmp_path: Path, source: Path) -> None:
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    wds(tmp_path, "one", shared).cat_file(str(path))
    [copy] = [p for p in (shared / "files").rglob("*") if p.is_file()]
    copy.chmod(0o600)
    copy.write_bytes(b"short")
    assert wds(tmp_path, "two", shared).cat_file(str(path)) == path.read_bytes()
    assert shared_files(shared) == {copy.name: path.read_bytes()}


def test_the_shared_tier_keeps_its_own_cap_evicting_least_recently_used(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_module, "SCAN_INTERVAL_SECONDS", 0.0)
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared, shared_cache_size=120_000)
    one.cat_file(str(source / "shard-0.tar"))
    one.cat_file(str(source / "shard-1.tar"))
    old = time.time() - 1000
    for number, copy in enumerate(sorted((shared / "files").rglob("*/*"), key=os.path.getmtime)):
        os.utime(copy, (old + number, old + number))
    wds(tmp_path, "two", shared).cat_file(str(source / "shard-0.tar"))  # a hit refreshes it
    one.cat_file(str(source / "shard-2.tar"))  # 150 KB would not fit: the LRU one goes
    assert sorted(shared_files(shared).values()) == sorted(
        [payload("shard-0", 50_000), payload("shard-2", 50_000)]
    )
    assert one.cache_stats()["shared_evictions"] == 1


def test_the_tier_is_scanned_once_per_interval_for_the_whole_cluster(
    tmp_path: Path, source: Path
) -> None:
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared, shared_cache_size=60_000)
    one.cat_file(str(source / "shard-0.tar"))  # the first publication scans (nothing to do)
    marker = shared / "locks" / "scan.lock"
    scanned_at = marker.stat().st_mtime
    two = wds(tmp_path, "two", shared, shared_cache_size=60_000)
    two.cat_file(str(source / "shard-1.tar"))  # over the cap, but "one" scanned just now
    assert len(shared_files(shared)) == 2 and marker.stat().st_mtime == scanned_at
    os.utime(marker, (time.time() - 100, time.time() - 100))  # the interval has passed
    three = wds(tmp_path, "three", shared, shared_cache_size=60_000)
    three.cat_file(str(source / "shard-2.tar"))
    assert sorted(shared_files(shared).values()) == [payload("shard-2", 50_000)]
    assert marker.stat().st_mtime > time.time() - 10


def test_a_scan_in_progress_elsewhere_is_not_repeated(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_module, "SCAN_INTERVAL_SECONDS", 0.0)
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared, shared_cache_size=60_000)
    one.cat_file(str(source / "shard-0.tar"))
    with locks.hold(str(shared / "locks" / "scan.lock")):  # another host is scanning
        one.cat_file(str(source / "shard-1.tar"))
    assert len(shared_files(shared)) == 2


def test_eviction_and_stale_temp_clean_up_delete_only_names_the_tier_makes(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_module, "SCAN_INTERVAL_SECONDS", 0.0)
    monkeypatch.setattr(shared_module, "STALE_TEMP_SECONDS", 60.0)
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared, shared_cache_size=60_000)
    one.cat_file(str(source / "shard-0.tar"))
    foreign = [shared / "files" / "README", shared / "tmp" / "notes.part"]
    for path in foreign:
        path.write_bytes(b"x" * 100_000)
    stale = shared / "tmp" / f"{obj('dead').key}.1.deadbeef.0.part"
    fresh = shared / "tmp" / f"{obj('alive').key}.2.deadbeef.0.part"
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    one.cat_file(str(source / "shard-1.tar"))
    assert all(path.exists() for path in foreign) and fresh.exists() and not stale.exists()
    assert list(shared_files(shared).values()).count(payload("shard-0", 50_000)) == 0


def test_invalidate_cache_never_serves_the_shared_copy_again(tmp_path: Path, source: Path) -> None:
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared)
    path = str(source / "shard-0.tar")
    one.cat_file(path)
    assert len(shared_files(shared)) == 1
    one.invalidate_cache(path)
    assert one.cat_file(path) == payload("shard-0", 50_000)
    assert one.cache_stats()["shared_hits"] == 0
    assert len(shared_files(shared)) == 2  # the old generation's copy: unreachable, evicted
    assert one.cache_stats()["bytes_downloaded"] == 2 * 50_000


def test_a_local_cache_is_never_taken_for_the_shared_tier_nor_the_other_way(
    tmp_path: Path,
) -> None:
    local = ShardCache(str(tmp_path / "local"), 1000)
    with pytest.raises(CacheDirectoryError, match="local tier"):
        SharedTier(local.directory, 1000)
    tier = SharedTier(str(tmp_path / "shared"), 1000)
    with pytest.raises(CacheDirectoryError, match="shared tier"):
        ShardCache(tier.directory, 1000)


def test_a_shared_tier_owned_by_another_user_is_refused(tmp_path: Path, source: Path) -> None:
    shared = tmp_path / "shared"
    SharedTier(str(shared), 1000)
    os.chown(shared, 12345, 12345)
    with pytest.raises(CacheDirectoryError, match="owned by uid 12345"):
        wds(tmp_path, "one", shared).cat_file(str(source / "shard-0.tar"))


def test_a_read_only_shared_tier_is_read_and_never_written(
    tmp_path: Path, source: Path, read_only_view
) -> None:
    shared = tmp_path / "shared"
    wds(tmp_path, "one", shared).cat_file(str(source / "shard-0.tar"))
    before = shared_files(shared)
    fs = wds(tmp_path, "two", read_only_view(shared))
    with pytest.warns(CacheWarning, match="read-only") as caught:
        assert fs.cat_file(str(source / "shard-0.tar")) == payload("shard-0", 50_000)
        assert fs.cat_file(str(source / "shard-1.tar")) == payload("shard-1", 50_000)
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    stats = fs.cache_stats()
    assert (stats["shared_hits"], stats["shared_misses"]) == (1, 1)
    assert shared_files(shared) == before


def test_a_copy_renamed_over_another_in_an_open_subdirectory_is_never_served(
    tmp_path: Path, source: Path
) -> None:
    """The attack of issue 22: ``files/<xx>/`` at 0777 lets another uid rename one shard's
    copy over another's; the copies stay ours and of the right size."""
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared)
    for index in range(2):
        one.cat_file(str(source / f"shard-{index}.tar"))
    [zero, first] = [version_path(one, shared, source / f"shard-{i}.tar") for i in range(2)]
    os.chmod(shared / "files", 0o755)  # searchable by others, writable by no one else
    for copy in (zero, first):
        os.chmod(copy.parent, 0o777)

    def swap(directories: dict[str, int]) -> None:
        os.rename(
            first.name, zero.name, src_dir_fd=directories["first"], dst_dir_fd=directories["zero"]
        )

    as_other_user(swap, {"zero": str(zero.parent), "first": str(first.parent)})
    assert zero.read_bytes() == payload("shard-1", 50_000)  # the swap happened
    two = wds(tmp_path, "two", shared)
    with pytest.warns(CacheWarning, match="writable by group or others"):
        assert two.cat_file(str(source / "shard-0.tar")) == payload("shard-0", 50_000)
    assert two.cache_stats()["shared_hits"] == 0
    assert zero.read_bytes() == payload("shard-1", 50_000)  # nothing published into it


def version_path(fs, shared: Path, path: Path) -> Path:
    """The shared tier's file of ``path`` as it is now."""
    from fsspec_shards.storage.backends import backend_for

    tier = fs.fetcher.shared
    identity = backend_for("file").identity(fs.fs.info(str(path)))
    return Path(
        layout.shared_data_path(str(shared), tier.version(fs.fetcher.object(str(path)), identity))
    )


def rewrite_keeping_size_and_mtime(fs, path: Path, data: bytes) -> None:
    """A write through ``wds`` whose new version the backend cannot tell from the old:
    the same size and modification time (one-second clocks, a restored mtime)."""
    before = path.stat()
    with fs.open(str(path), "wb") as file:
        file.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


def test_a_write_through_wds_is_never_served_the_old_shared_copy_on_any_host(
    tmp_path: Path, source: Path
) -> None:
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    one, two = wds(tmp_path, "one", shared), wds(tmp_path, "two", shared)
    assert one.cat_file(str(path)) == payload("shard-0", 50_000)
    new = payload("rewritten", 50_000)
    rewrite_keeping_size_and_mtime(one, path, new)
    assert one.cat_file(str(path)) == new  # the writing host
    assert two.cat_file(str(path)) == new  # another host, never read it before
    reader = (
        "import fsspec, hashlib, sys;"
        "fs = fsspec.filesystem('wds', target_protocol='file', cache_dir=sys.argv[1],"
        " shared_cache_dir=sys.argv[2]);"
        "print(hashlib.sha256(fs.cat_file(sys.argv[3])).hexdigest())"
    )
    third_host = [sys.executable, "-c", reader, str(tmp_path / "local-three"), str(shared)]
    result = subprocess.run([*third_host, str(path)], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == hashlib.sha256(new).hexdigest()  # another process
    assert (one.cache_stats()["shared_hits"], two.cache_stats()["shared_hits"]) == (0, 1)


def test_invalidate_cache_reaches_every_host_through_the_shared_tier(
    tmp_path: Path, source: Path
) -> None:
    shared = tmp_path / "shared"
    path = str(source / "shard-0.tar")
    one, two = wds(tmp_path, "one", shared), wds(tmp_path, "two", shared)
    one.cat_file(path)
    one.invalidate_cache(path)
    assert two.cat_file(path) == payload("shard-0", 50_000)
    assert two.cache_stats()["shared_hits"] == 0


def test_a_generations_directory_others_may_write_turns_the_tier_off_for_reads(
    tmp_path: Path, source: Path
) -> None:
    """Whoever may write ``generations/`` may bring back a generation from before a write."""
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    one = wds(tmp_path, "one", shared)
    one.pipe_file(str(path), payload("shard-0", 50_000))
    one.cat_file(str(path))
    os.chmod(shared / layout.GENERATIONS, 0o777)
    two = wds(tmp_path, "two", shared)
    with pytest.warns(CacheWarning, match="generations is writable by group or others"):
        assert two.cat_file(str(path)) == payload("shard-0", 50_000)
    assert (two.cache_stats()["shared_hits"], two.cache_stats()["bytes_downloaded"]) == (0, 50_000)


@pytest.mark.parametrize("blocker", ["symlink", "foreign file"])
def test_a_blocker_at_a_versions_name_is_replaced_by_the_next_publication(
    tmp_path: Path, source: Path, blocker: str
) -> None:
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    wds(tmp_path, "one", shared).cat_file(str(path))
    copy = version_path(wds(tmp_path, "one", shared), shared, path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not the shard, and not the tier's to touch")
    copy.unlink()
    if blocker == "symlink":
        copy.symlink_to(elsewhere)
    else:
        copy.write_bytes(payload("shard-0", 50_000))
        os.chown(copy, NOBODY, NOBODY)
    two = wds(tmp_path, "two", shared)
    assert two.cat_file(str(path)) == payload("shard-0", 50_000)
    assert two.cache_stats()["shared_misses"] == 1  # never followed, never trusted
    assert not copy.is_symlink() and copy.stat().st_uid == os.geteuid()
    assert elsewhere.read_bytes() == b"not the shard, and not the tier's to touch"
    three = wds(tmp_path, "three", shared)
    assert three.cat_file(str(path)) == payload("shard-0", 50_000)
    assert (three.cache_stats()["shared_hits"], three.cache_stats()["bytes_downloaded"]) == (1, 0)


def test_refusals_in_the_shared_tier_name_its_own_option(tmp_path: Path, source: Path) -> None:
    shared = tmp_path / "shared"
    path = source / "shard-0.tar"
    wds(tmp_path, "one", shared).cat_file(str(path))
    copy = version_path(wds(tmp_path, "one", shared), shared, path)
    for entry in copy.parent.iterdir():
        entry.unlink()
    copy.parent.rmdir()
    (tmp_path / "planted").mkdir(mode=0o700)
    copy.parent.symlink_to(tmp_path / "planted")
    with pytest.warns(CacheWarning) as caught:
        assert wds(tmp_path, "two", shared).cat_file(str(path)) == payload("shard-0", 50_000)
    [message] = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert f"{copy.parent} is a symlink" in message
    assert "shared_cache_dir (or FSSPEC_SHARDS_SHARED_CACHE)" in message
    assert "set cache_dir" not in message
    os.chown(shared, NOBODY, NOBODY)
    with pytest.raises(CacheDirectoryError, match="set shared_cache_dir") as raised:
        wds(tmp_path, "three", shared).cat_file(str(path))
    assert "set cache_dir" not in str(raised.value)


def test_a_file_failing_any_known_checksum_reaches_neither_tier(
    tmp_path: Path, source: Path
) -> None:
    # the sums file gives the shard in md5 form (of other bytes), the block manifest its
    # honest blocks: every block matches, the md5 does not; nothing is published anywhere
    path = source / "shard-0.tar"
    hasher = BlockHasher(4096)
    hasher.update(path.read_bytes())
    wrong = Checksum("md5", hashlib.md5(b"other bytes").hexdigest())
    (source / "SHA256SUMS").write_text(format_sums([("shard-0.tar", wrong)]))
    (source / "SHA256SUMS.blocks").write_text(
        format_block_manifest([("shard-0.tar", hasher.block_list())], 4096)
    )
    shared = tmp_path / "shared"
    one = wds(tmp_path, "one", shared, checksums=str(source / "SHA256SUMS"))
    with pytest.raises(IntegrityError, match=str(wrong)):
        one.cat_file(str(path))
    assert shared_files(shared) == {}
    assert one.cache_stats()["cached_files"] == 0
