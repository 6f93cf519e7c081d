"""How the index's rows are stored in diskcache: their names, their values, and the
serializer that keeps every value inside ``cache.db``.

One ``diskcache.Cache`` on the cache directory (its database, ``cache.db``) holds, under
string keys::

    entry:<key>        a published file: JSON {file, size, shown, stored_at, validated_at,
                       metadata}; the row's size column is the file's size
    pending:<key>      JSON {file, boot}: that file of the entry is not durable yet; it was
                       published under boot ``boot`` (storage/cache/durability.py)
    generation:<key>   the key's write generation (int)
    counter:<name>     a counter shared by every process (int)
    size_limit         the size limit the cache was last used with (int)
    key_format         the ObjectId key format the entries were made under

Invariants:

- The index never holds a secret: keys are digests, URLs are shown (redacted) text.
- Values stay inside ``cache.db``, and nothing read from a row is unpickled, opened or
  deleted by diskcache (:class:`IndexDisk`): a planted row is data, never a path followed;
  a value the index did not write reads as no record (:func:`record`).
- Rows other than entries have size 0, so diskcache's maintained total size is the bytes
  of the cached files.
"""

from __future__ import annotations

import json
from typing import Any

import diskcache
from diskcache.core import MODE_RAW, UNKNOWN

ENTRY, GENERATION, COUNTER, KEY_FORMAT_NAME = "entry:", "generation:", "counter:", "key_format"
PENDING = "pending:"
SIZE_LIMIT = "size_limit"


class Row:
    """An entry: file (relative name as stored; None if the row is not one the cache
    wrote), size, shown URL and times."""

    __slots__ = ("key", "file", "size", "shown", "stored_at", "accessed_at", "validated_at")

    def __init__(self, key: str, record: dict | None, size: int, accessed_at: float) -> None:
        record = record or {}
        self.key, self.file, self.size = key, record.get("file"), size
        self.shown = str(record.get("shown") or f"an entry the cache did not write ({key})")
        self.stored_at = record.get("stored_at", accessed_at)
        self.validated_at = record.get("validated_at", self.stored_at)
        self.accessed_at = accessed_at


class Entry:
    """An entry's value as diskcache stores it: JSON text, and the file's size."""

    __slots__ = ("size", "text")

    def __init__(self, record: dict) -> None:
        self.size = record["size"]
        self.text = json.dumps(record, default=str)


def read_record(value: Any) -> dict | None:
    """The record of an entry's stored text; None for anything the index did not write."""
    if not isinstance(value, str):
        return None
    try:
        loaded = json.loads(value)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("file"), str):
        return None
    return loaded if type(loaded.get("size")) is int else None


def integer(value: Any) -> int:
    return value if type(value) is int else 0


class IndexDisk(diskcache.Disk):
    """diskcache's serializer for the index: every value stays inside ``cache.db``, an
    entry's row carries its file's size, and a row's value is never unpickled and its
    filename never opened or deleted (the cache deletes its own files, by the names it
    makes)."""

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple:
        if isinstance(value, Entry):
            return value.size, MODE_RAW, None, value.text
        if type(value) in (int, str):
            return 0, MODE_RAW, None, value
        raise TypeError(f"the cache index stores no {type(value).__name__}")

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        return value if mode == MODE_RAW else None

    def remove(self, file_path: str) -> None:
        """Nothing: diskcache writes no files for the index."""


def file_and_size(value: Any, pending: Any) -> tuple[str, int, str | None] | None:
    found = read_record(value)
    if found is None:
        return None
    return found["file"], found["size"], pending_boot(pending, found["file"])


def pending_boot(value: Any, file: str) -> str | None:
    """The boot under which ``file`` was published if its pending row names it, else None."""
    try:
        pending = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(pending, dict) or pending.get("file") != file:
        return None
    return str(pending.get("boot"))
