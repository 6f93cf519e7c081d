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


def _described(directory: str) -> tuple:
    connection = sqlite3.connect(f"{directory}/cache.db")
    try:
        pragmas = [connection.execute(f"PRAGMA {name}").fetchall() for name in _PRAGMAS]
        return (
            sorted(connection.execute("SELECT type, name, sql FROM sqlite_master")),
            sorted(connection.execute("SELECT key, value FROM Settings")),
            pragmas,
        )
    finally:
        connection.close()


_PRAGMAS = ("auto_vacuum", "journal_mode")
SETTINGS = {
    "cull_limit": 0,
    "statistics": False,
    "sqlite_journal_mode": "delete",
    "sqlite_synchronous": 2,
}


def test_a_cache_opened_in_one_transaction_is_the_cache_diskcache_makes(tmp_path) -> None:
    # the same tables, triggers, settings and pragmas, made and reopened
    made, ours = tmp_path / "made", tmp_path / "ours"
    diskcache.Cache(str(made), **SETTINGS).close()
    for _ in range(2):
        cache = deps.open_cache(str(ours), **SETTINGS)
        cache.set("entry:a", b"x")
        assert cache.get("entry:a") == b"x" and not cache._con.in_transaction
        assert cache.delete("entry:a")
        cache.close()
    assert _described(str(ours)) == _described(str(made))


def test_every_write_of_opening_a_cache_is_in_the_one_transaction(tmp_path, monkeypatch) -> None:
    # diskcache's set-up commits each statement (2+ fdatasyncs each under FULL): here the
    # writes wait for one COMMIT
    seen: list[tuple[str, bool]] = []
    real = diskcache.Cache._sql_retry.fget

    def watched(cache):
        execute = real(cache)

        def run(statement, *args, **kwargs):
            seen.append((statement.split()[0].upper(), cache._local.con.in_transaction))
            return execute(statement, *args, **kwargs)

        return run

    monkeypatch.setattr(diskcache.Cache, "_sql_retry", property(watched))
    for _ in range(2):  # made, then opened again
        seen.clear()
        deps.open_cache(str(tmp_path), **SETTINGS).close()
        writes = [inside for word, inside in seen if word in {"CREATE", "INSERT", "UPDATE"}]
        assert writes and all(writes)
        assert [word for word, _ in seen].count("COMMIT") == 1
