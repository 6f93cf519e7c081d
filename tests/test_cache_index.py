"""The index of a cache directory (storage/cache/index.py): published rows, rows not durable
yet and made durable, generations that keep a download begun before a write from
publishing, and least-recently-used order."""

from __future__ import annotations

import contextlib

import pytest

from fsspec_shards.storage.cache.index import Index


@pytest.fixture
def index(tmp_path) -> Index:
    return Index(str(tmp_path), True, space_lock=contextlib.nullcontext, on_reset=lambda: None)


def _publish(index: Index, key: str, file: str | None = None, boot: str | None = None, size=10):
    since = index.generation(key)
    return index.publish(key, file or f"{key}.bin", size, f"s3://b/{key}", {"m": key}, since, boot)


def test_a_published_file_is_looked_up_with_its_size_and_metadata(index):
    assert index.lookup("k") is None
    assert _publish(index, "k", size=123) == (True, None)
    assert index.lookup("k") == ("k.bin", 123, None)
    row, metadata = index.metadata("k")
    assert (row.file, row.size, row.shown, metadata) == ("k.bin", 123, "s3://b/k", {"m": "k"})
    assert index.totals() == (1, 123) and index.cached_bytes() == 123


def test_publishing_again_replaces_the_entry_and_names_the_file_it_replaced(index):
    _publish(index, "k", "old.bin")
    assert _publish(index, "k", "new.bin", size=7) == (True, "old.bin")
    assert index.lookup("k") == ("new.bin", 7, None)
    assert index.totals() == (1, 7)


def test_a_download_begun_before_a_write_does_not_publish_after_it(index):
    since = index.generation("k")
    assert index.drop("k", written=True) is None  # a write: the generation moves on
    assert index.publish("k", "stale.bin", 1, "s3://b/k", {}, since) == (False, None)
    assert index.lookup("k") is None
    assert index.publish("k", "fresh.bin", 1, "s3://b/k", {}, since + 1) == (True, None)


def test_a_file_published_under_a_boot_is_pending_until_marked_durable(index):
    _publish(index, "k", "f1", boot="boot-1")
    assert index.lookup("k") == ("f1", 10, "boot-1")
    index.mark_durable("k", "f1")
    assert index.lookup("k") == ("f1", 10, None)


def test_marking_a_replaced_file_durable_leaves_its_replacement_pending(index):
    _publish(index, "k", "f1", boot="boot-1")
    _publish(index, "k", "f2", boot="boot-1")  # published before f1's sync finished
    index.mark_durable("k", "f1")
    assert index.lookup("k") == ("f2", 10, "boot-1")
    _publish(index, "k", "f3")  # durable before it was published: nothing pending
    assert index.lookup("k") == ("f3", 10, None)


def _pending_row(tmp_path, key: str) -> str | None:
    """What another process reads: the index's own row, not this one's memory."""
    other = Index(str(tmp_path), True, space_lock=contextlib.nullcontext, on_reset=lambda: None)
    found = other.lookup(key)
    return None if found is None else found[2]


def test_a_file_noted_durable_is_recorded_by_the_next_write_and_looked_up_durable_until(
    index, tmp_path
):
    _publish(index, "k", "f1", boot="boot-1")
    _publish(index, "r", "r1", boot="boot-1")
    index.note_durable("k", "f1")  # (the syncer's thread: nothing written)
    index.note_durable("r", "r0")  # a file replaced before its sync: nothing to record
    assert index.lookup("k") == ("f1", 10, None)
    assert _pending_row(tmp_path, "k") == "boot-1" and index.durable_unrecorded()
    index.record_usage({}, {"hits": 1})  # any write of the process
    assert _pending_row(tmp_path, "k") is None and not index.durable_unrecorded()
    assert index.lookup("r") == ("r1", 10, "boot-1")


def test_a_write_that_fails_keeps_what_was_noted_durable(index, tmp_path):
    _publish(index, "k", "f1", boot="boot-1")
    index.note_durable("k", "f1")

    def fails(store):
        raise OSError("disk trouble")

    with pytest.raises(OSError):
        index._write(fails)
    assert index.durable_unrecorded() and _pending_row(tmp_path, "k") == "boot-1"
    _publish(index, "other")
    assert _pending_row(tmp_path, "k") is None


def test_dropping_an_entry_drops_its_pending_row(index):
    _publish(index, "k", "f1", boot="boot-1")
    assert index.drop("k", written=False) == "f1"
    _publish(index, "k", "f1")
    assert index.lookup("k") == ("f1", 10, None)


def test_entries_come_least_recently_used_first_and_a_use_moves_one_to_the_end(index):
    for key in ("a", "b", "c"):
        _publish(index, key)
    assert [row.key for row in index.rows()] == ["a", "b", "c"]
    index.record_usage({"b": 2.0, "a": 1.0}, {"hits": 2})  # a used, then b
    assert [row.key for row in index.rows()] == ["c", "a", "b"]
    assert index.least_recent().key == "c"
    assert index.counters() == {"hits": 2}


def test_making_an_entry_durable_keeps_its_place(index):
    _publish(index, "a", boot="boot-1")
    _publish(index, "b")
    index.mark_durable("a", "a.bin")
    assert [row.key for row in index.rows()] == ["a", "b"]
