"""The index's rows (storage/cache/index_rows.py): only what the index wrote reads as a record,
values stay inline in the database, and a pending row names the file it is about."""

from __future__ import annotations

import json

import pytest
from diskcache.core import MODE_RAW

from fsspec_shards.storage.cache.index_rows import (
    Entry,
    IndexDisk,
    file_and_size,
    pending_boot,
    read_record,
)


def test_a_record_is_what_the_index_wrote_and_anything_else_is_none():
    record = {"file": "files/ab/x", "size": 3, "shown": "s3://b/x"}
    assert read_record(Entry(record).text) == record
    for planted in ([1], b"{}", "not json", '{"file": 1, "size": 3}', '{"file": "f", "size": "3"}'):
        assert read_record(planted) is None


def test_values_stay_inside_the_database_and_an_entry_carries_its_size():
    disk = IndexDisk.__new__(IndexDisk)  # store() and fetch() use no state
    entry = Entry({"file": "files/ab/x", "size": 42})
    assert disk.store(entry, False) == (42, MODE_RAW, None, entry.text)
    assert disk.store(7, False) == (0, MODE_RAW, None, 7)
    with pytest.raises(TypeError):
        disk.store(object(), False)
    assert disk.fetch(MODE_RAW, None, "text", False) == "text"
    assert disk.fetch(4, "../../etc/passwd", None, False) is None  # a pickled row: never read


def test_a_pending_row_counts_only_for_the_file_it_names():
    value = Entry({"file": "files/ab/x", "size": 3}).text
    pending = json.dumps({"file": "files/ab/x", "boot": "b1"})
    assert file_and_size(value, pending) == ("files/ab/x", 3, "b1")
    assert pending_boot(pending, "files/ab/other") is None
    assert file_and_size(value, None) == ("files/ab/x", 3, None)
    assert file_and_size("planted", pending) is None
