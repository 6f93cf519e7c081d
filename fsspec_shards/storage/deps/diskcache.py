"""diskcache beyond its public API.

Uses:

- ``Cache._con``: the calling thread's connection, the one ``Cache.transact()`` holds a
  write transaction on, to delete many rows in one statement (diskcache deletes one key
  per call, three statements each: 50,000 evictions took seconds). Its triggers
  (``Settings_count_delete``, ``Settings_size_delete``) keep the count and the total size
  it maintains, as its own deletes do.
"""

from __future__ import annotations

from collections.abc import Sequence

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
