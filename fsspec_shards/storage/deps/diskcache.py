"""diskcache beyond its public API.

Uses:

- ``Cache._con``: the calling thread's connection, the one ``Cache.transact()`` holds a
  write transaction on, to delete many rows in one statement (diskcache deletes one key
  per call, three statements each: 50,000 evictions took seconds). Its triggers
  (``Settings_count_delete``, ``Settings_size_delete``) keep the count and the total size
  it maintains, as its own deletes do.
- ``Cache.__init__``'s own statements (:func:`open_cache`): it writes each setting, table,
  index and trigger in a transaction of its own, and under ``synchronous=FULL`` with a
  rollback journal each is two or more ``fdatasync`` calls: 108 to make an index, 48 to
  open one (0.1-0.7 s per process and cache directory on a busy disk). Run in one write
  transaction (begun at its first write, after its pragmas), they cost one commit; what
  they write is the same. Uses ``_sql_retry`` (its retried execute, which ``__init__``
  and ``reset`` take), ``_local.con`` (the connection) and that ``__init__`` ends with
  ``close()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import diskcache

_NAMES_PER_STATEMENT = 500  # under SQLite's smallest limit on bound parameters (999)


def delete_raw_keys(cache: diskcache.Cache, names: Sequence[str]) -> int:
    """Inside ``cache.transact()``: delete the rows of the string keys ``names`` (absent
    ones are skipped); how many were deleted."""
    connection = cache._con
    deleted = 0
    for start in range(0, len(names), _NAMES_PER_STATEMENT):
        chunk = names[start : start + _NAMES_PER_STATEMENT]
        marks = ",".join("?" * len(chunk))
        cursor = connection.execute(
            f"DELETE FROM Cache WHERE raw = 1 AND key IN ({marks})", tuple(chunk)
        )
        deleted += cursor.rowcount
    return deleted


_WRITES = frozenset({"CREATE", "INSERT", "UPDATE", "DELETE", "DROP"})


class _SetUpAtOnce(diskcache.Cache):
    """A ``diskcache.Cache`` whose opening statements run in one write transaction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._setting_up = True
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._setting_up = False

    @property
    def _sql_retry(self) -> Callable[..., Any]:
        execute = diskcache.Cache._sql_retry.fget(self)
        if not self._setting_up:
            return execute

        def in_one_transaction(statement: str, *args: Any, **kwargs: Any) -> Any:
            # (pragmas first, outside it: auto_vacuum and journal_mode take no effect in one)
            writes = statement.split(None, 1)[0].upper() in _WRITES
            if writes and self._setting_up and not self._local.con.in_transaction:
                execute("BEGIN IMMEDIATE")
            return execute(statement, *args, **kwargs)

        return in_one_transaction

    def close(self) -> None:
        connection = getattr(self._local, "con", None)
        if self._setting_up and connection is not None and connection.in_transaction:
            self._sql_retry("COMMIT")  # __init__ ends by closing its connection
            self._setting_up = False  # and opening the one it keeps
        super().close()


def open_cache(directory: str, **options: Any) -> diskcache.Cache:
    """``diskcache.Cache(directory, **options)``, its set-up written in one transaction."""
    return _SetUpAtOnce(directory, **options)
