"""diskcache's private parts we use (``storage/deps/diskcache.py``): these fail when
diskcache changes them."""

from __future__ import annotations

import sqlite3

import diskcache

from fsspec_shards.storage.deps import diskcache as deps


def maintained(directory: str) -> tuple[int, int]:
    connection = sqlite3.connect(f"{directory}/cache.db")
    try:
        found = dict(connection.execute("SELECT key, value FROM Settings"))
    finally:
        connection.close()
    return found["count"], found["size"]


def test_deleting_many_keys_in_a_transaction_keeps_the_count_and_size_diskcache_keeps(
    tmp_path,
) -> None:
    # every value in a file of its own: its size counts in diskcache's total
    cache = diskcache.Cache(str(tmp_path), cull_limit=0, statistics=False, disk_min_file_size=0)
    for number in range(1200):
        cache.set(f"entry:{number}", b"x" * 10)
    before = maintained(str(tmp_path))
    assert before == (1200, 12000)
    names = [f"entry:{number}" for number in range(0, 1200, 2)] + ["entry:absent"]
    with cache.transact():
        assert deps.delete_raw_keys(cache, names) == 600
    assert len(cache) == 600 and "entry:0" not in cache and cache.get("entry:1") == b"x" * 10
    count, size = maintained(str(tmp_path))
    assert (count, size) == (600, 6000)
    cache.close()


def test_a_delete_inside_a_transaction_that_fails_is_rolled_back(tmp_path) -> None:
    cache = diskcache.Cache(str(tmp_path), cull_limit=0, statistics=False)
    cache.set("entry:a", "x")
    try:
        with cache.transact():
            deps.delete_raw_keys(cache, ["entry:a"])
            raise RuntimeError("abandon")
    except RuntimeError:
        pass
    assert cache.get("entry:a") == "x" and maintained(str(tmp_path))[0] == 1
    cache.close()
