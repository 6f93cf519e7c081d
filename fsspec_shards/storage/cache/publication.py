"""Publishing a download into a cache: temp file, verified size, rename, index entry.

Invariants:

- Whole and verified, or absent. A download writes into a temp file in ``tmp/`` that
  reserves its bytes; only after ``download()`` returns (it verifies what it wrote) is the
  file made read-only, renamed into ``files/`` and recorded in the index. A process killed
  at any instant leaves a temp file or an unindexed file (both removed later, by name) or
  a whole entry.
- Durable, or verified again: with a boot id the fsync of a published file and its
  directory runs in the background (:mod:`.durability`) and the entry is recorded as not
  durable under this boot (until this process's next index write records what the sync
  noted: :meth:`.Index.note_durable`); without one the fsync comes before publishing.
- Generations: the entry is recorded only if no write of the object happened since
  ``since``; otherwise the caller gets its own copy, already unlinked.
- The file is opened before the index names it: from then on another thread or process
  may remove it, and the caller still reads it.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import time
from collections.abc import Callable
from typing import BinaryIO

from fsspec_shards.errors import IntegrityError
from fsspec_shards.redact import redact_url
from fsspec_shards.storage.backends import ObjectId
from fsspec_shards.storage.cache import layout, trust
from fsspec_shards.storage.cache.durability import SYNCER, boot_id
from fsspec_shards.storage.cache.room import READ_FLAGS, CacheFullError, Room, wait_for_room

logger = logging.getLogger("fsspec_shards.storage.cache")


def download_and_publish(
    room: Room,
    obj: ObjectId,
    key: str,
    download: Callable[[BinaryIO], dict],
    expected_size: int | None,
    since: int,
) -> io.FileIO:
    """Download into a temp file and publish it (on a full disk: :meth:`Room.with_room`);
    the published file, or the caller's own copy where a write came first."""
    reserve = expected_size or 0
    written = [0]

    def attempt() -> io.FileIO:
        temp = room.reserve(obj.shown, key, reserve)
        try:
            return _write_and_publish(room, obj, key, temp, download, expected_size, since)
        except BaseException:
            written[0] = _size_of(temp)
            layout.remove_file(temp)
            raise

    return room.with_room(
        attempt,
        lambda: max(reserve, written[0] + 1),
        lambda detail: CacheFullError(obj.shown, detail),
    )


def _write_and_publish(
    room: Room,
    obj: ObjectId,
    key: str,
    temp: str,
    download: Callable[[BinaryIO], dict],
    expected_size: int | None,
    since: int,
) -> io.FileIO:
    """Let ``download`` fill ``temp``, make it durable, rename it into ``files/`` and
    record it, unless the object was written meanwhile."""
    started = time.monotonic()
    boot = boot_id()
    size, metadata = _write(room, obj, temp, download, expected_size, durable=boot is None)
    record = {
        name: redact_url(value) if isinstance(value, str) else value
        for name, value in metadata.items()
    }
    handle, published = _publish(room, obj, key, temp, size, record, since, boot)
    if published:
        seconds = time.monotonic() - started
        logger.log(room.log_level, "cached %s (%d bytes in %.2fs)", obj.shown, size, seconds)
    else:
        logger.log(room.log_level, "not caching %s: it was written meanwhile", obj.shown)
    return handle


def _write(
    room: Room,
    obj: ObjectId,
    temp: str,
    download: Callable[[BinaryIO], dict],
    expected_size: int | None,
    *,
    durable: bool,
) -> tuple[int, dict]:
    """Let ``download`` fill ``temp`` and make it read-only (and durable: no way to tell
    a reboot later without a boot id; otherwise durability.py syncs it in the background);
    its size and the download's metadata."""
    with open(temp, "r+b") as file:
        metadata = download(file) or {}
        file.flush()
        layout.finish_file(file.fileno(), read_only=True, durable=durable)
        size = os.fstat(file.fileno()).st_size
    # The download says what it verified (a newer version may differ in size from
    # what was reserved); otherwise the size announced beforehand must hold.
    promised = metadata.get("size", expected_size)
    if promised is not None and size != promised:
        room.usage.add("integrity_failures")
        raise IntegrityError(obj.shown, f"{promised} bytes", f"{size} bytes", "cached download")
    return size, metadata


def _publish(
    room: Room,
    obj: ObjectId,
    key: str,
    temp: str,
    size: int,
    record: dict,
    since: int,
    boot: str | None,
) -> tuple[io.FileIO, bool]:
    """Once there is room for ``size`` bytes (``temp``'s reservation aside): rename
    ``temp`` to a fresh data file of ``key`` and record it; the file open for reading,
    and whether it was published."""
    relative = layout.new_data_file(key)
    final = os.path.join(room.directory, relative)
    while True:
        with room.space_lock():
            fits = room.make_room(obj.shown, size, excluding=temp)
            if fits:
                os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
                if not room.files.shard_is_safe(key[:2]):
                    raise trust.CacheDirectoryError(
                        os.path.dirname(final),
                        "is not a private directory of the cache",
                        "remove it (the cache makes it again)",
                    )
                handle, published, replaced = _rename_and_record(
                    room, key, temp, final, relative, size, obj.shown, record, since, boot
                )
                if not published:
                    layout.remove_file(final)
                else:
                    if boot is not None:
                        noted = functools.partial(room.index.note_durable, key, relative)
                        SYNCER.submit(final, noted)
                    if replaced is not None and replaced != relative:
                        room.files.remove_data_file(key, replaced)
                return handle, published
        wait_for_room(fits, obj.shown)


def _rename_and_record(
    room: Room,
    key: str,
    temp: str,
    final: str,
    relative: str,
    size: int,
    shown: str,
    record: dict,
    since: int,
    boot: str | None,
) -> tuple[io.FileIO, bool, str | None]:
    """Rename ``temp`` to ``final``, open it, and publish it in the index; the handle,
    whether it was published and the file it replaced. Anything raised removes ``final``."""
    handle = None
    try:
        layout.rename_into_place(temp, final, durable=boot is None)
        # opened before the index names it: from then on a discard by
        # another thread or process may remove it (the handle still reads)
        handle = io.FileIO(os.open(final, READ_FLAGS), "rb")
        handle.name = final
        published, replaced = room.index.publish(
            key, relative, size, redact_url(shown), record, since, boot
        )
    except BaseException:
        if handle is not None:
            handle.close()
        layout.remove_file(final)
        raise
    return handle, published, replaced


def _size_of(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0
