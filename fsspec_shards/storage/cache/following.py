"""Following a fill in flight: readers of an object while the cache fills it.

With a block manifest entry for an object, a cold object need not be whole before a reader
starts (the fill: ``transfer/blocks.py``, which verifies each block as it completes):

- Readers (:class:`ProgressiveReader`, behind ``open()``, ``cat_file`` and the tar reader)
  read the temp file, opened read-only, and never past a block that is not verified: they
  wait for it. Nothing unverified is handed out, ever.
- Other processes asking for the same object while it downloads (the single flight holds
  the key's lock) follow the same fill: the filler publishes its verified blocks in a small
  record ``tmp/<key>.progress`` (JSON, replaced atomically by rename, see
  :class:`ProgressRecord`), which they poll, reading the temp file read-only. When the
  filler dies (its lock comes free without a published entry), a follower starts over
  through the cache (becoming the filler, or following the next one); bytes it already had
  stay valid, since the block manifest fixes every byte.
- The cache's own rules stand: the entry is published (fsynced, renamed, indexed) only when
  the whole object is verified; a kill at any instant leaves a temp file and a record, both
  removed by name on the next miss, never a partial entry.
- A reader of a fill of this process gets the object's last bytes once the fetch ended
  (published, its record removed): nothing of the fill writes into the cache directory
  after that read returned (the caller may remove the directory).
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from fsspec_shards.checksums import BlockList
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.cache import layout, locks
from fsspec_shards.storage.transfer.block_progress import BlockProgress, verified_run_end

logger = logging.getLogger("fsspec_shards.storage.cache.following")

RECORD_INTERVAL_SECONDS = 0.01
"""At most this often the progress record is replaced while blocks verify (the last block
and a failure are always written at once)."""
_POLL_FIRST_SECONDS = 0.002
_POLL_MAX_SECONDS = 0.02
_LOCK_CHECK_SECONDS = 0.2
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILLS: dict[tuple[int, str, str], LocalFill] = {}
"""This process's fills in flight by (pid, cache directory, key): its readers wait on them
directly. Keyed by pid: a forked child sees its parent's entries, whose threads it lacks."""
_FILLS_LOCK = threading.Lock()


class FillerGone(Exception):
    """The fill a reader followed ended without finishing (killed, or failed over there)."""


# -- what a reader follows: a fill here, one in another process, or a whole file -----------


class LocalFill:
    """A fill of this process: its progress, the temp file it writes and its record."""

    def __init__(self, progress: BlockProgress, temp_path: str, record: ProgressRecord) -> None:
        self.progress = progress
        self.temp_path = temp_path
        self.record = record
        self.ended = threading.Event()
        """Set when the cache's fetch around this fill returned (published) or raised."""

    def readable_end(self, offset: int) -> int:
        return self.progress.readable_end(offset)

    def wait_until_ended(self) -> None:
        """Wait for the cache's fetch around the fill to end; raises the fill's failure."""
        self.ended.wait()
        if self.progress.failure is not None:
            raise self.progress.failure


class ProgressRecord:
    """``tmp/<key>.progress``: the fill's state for other processes, replaced atomically.

    JSON: ``{"temp": <temp file name>, "size", "block_size", "state": "filling"|"failed",
    "verified": [[first, end], ...] (runs of verified block indices), "error", "integrity"}``.
    It is advice to live readers only: trusted while the key's lock is held and the temp
    file it names exists; never fsynced (a crash leaves no reader to advise).
    """

    def __init__(self, directory: str, key: str, temp_path: str) -> None:
        self.root = directory
        self.key = key
        self.path = layout.temp_path(directory, layout.progress_name(key))
        self.temp_name = os.path.basename(temp_path)
        self._lock = threading.Lock()
        self._recorded_at = 0.0

    def changed(self, progress: BlockProgress, force: bool) -> None:
        """More blocks are verified: replaced at most every ``RECORD_INTERVAL_SECONDS``
        (at once with ``force``)."""
        now = time.monotonic()
        if force or now - self._recorded_at >= RECORD_INTERVAL_SECONDS:
            self._recorded_at = now
            self.write(progress, "filling")

    def failed(self, progress: BlockProgress, error: BaseException) -> None:
        """The fill ended without verifying every block."""
        self.write(progress, "failed", error)

    def write(
        self, progress: BlockProgress, state: str, error: BaseException | None = None
    ) -> None:
        with self._lock:
            record = {
                "temp": self.temp_name,
                "size": progress.blocks.size,
                "block_size": progress.blocks.block_size,
                "state": state,
                "verified": _runs(progress.verified),
            }
            if error is not None:
                record["error"] = str(error)
                record["integrity"] = isinstance(error, IntegrityError)
            staging = layout.temp_path(self.root, layout.new_progress_name(self.key))
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                descriptor = os.open(staging, flags, 0o600)
                try:
                    os.write(descriptor, json.dumps(record).encode())
                finally:
                    os.close(descriptor)
                os.replace(staging, self.path)
            except OSError as exc:  # followers then wait for the published entry instead
                layout.remove_file(staging)
                logger.debug("cannot write progress record %s: %s", self.path, exc)

    def remove(self) -> None:
        with self._lock:
            try:
                current = read_record(self.path)
                if current is not None and current.get("temp") == self.temp_name:
                    layout.remove_file(self.path)
            except OSError:
                pass


def _runs(verified: bytearray) -> list[list[int]]:
    runs: list[list[int]] = []
    index = 0
    while index < len(verified):
        if verified[index]:
            start = index
            while index < len(verified) and verified[index]:
                index += 1
            runs.append([start, index])
        else:
            index += 1
    return runs


def read_record(path: str) -> dict | None:
    """The progress record at ``path``, or None (none there, or not one the cache wrote)."""
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        data = os.read(descriptor, 1 << 20)
    finally:
        os.close(descriptor)
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class RecordFollower:
    """Another process's fill, seen through its progress record (polled)."""

    def __init__(
        self, record_path: str, lock_path: str, temp_name: str, blocks: BlockList, shown: str
    ) -> None:
        self.record_path = record_path
        self.lock_path = lock_path
        self.temp_name = temp_name
        self.blocks = blocks
        self.shown = shown
        self.verified = bytearray(len(blocks))

    def readable_end(self, offset: int) -> int:
        """Poll until the block holding ``offset`` is verified over there; raises
        ``IntegrityError`` when the filler gave up on a bad block, :class:`FillerGone` when the
        record vanished, names another fill, or its filler died."""
        index = self.blocks.block_at(offset)
        pause = _POLL_FIRST_SECONDS
        last_lock_check = time.monotonic()
        while not self.verified[index]:
            record = read_record(self.record_path)
            if record is None or record.get("temp") != self.temp_name:
                raise FillerGone("the fill's record is gone")
            for first, end in record.get("verified", ()):
                self.verified[first:end] = b"\x01" * (end - first)
            if self.verified[index]:
                break
            if record.get("state") == "failed":
                if record.get("integrity"):
                    raise IntegrityError(
                        self.shown, "verified blocks", "a bad block", record.get("error", "")
                    )
                raise FillerGone(record.get("error", "failed"))
            if time.monotonic() - last_lock_check >= _LOCK_CHECK_SECONDS:
                if locks.is_free(self.lock_path):
                    raise FillerGone("the filling process is gone")
                last_lock_check = time.monotonic()
            time.sleep(pause)
            pause = min(_POLL_MAX_SECONDS, pause * 2)
        return verified_run_end(self.blocks, self.verified, index)


class _Complete:
    """A published, whole file: everything may be read."""

    def __init__(self, size: int) -> None:
        self.size = size

    def readable_end(self, offset: int) -> int:
        return self.size


def _open_read_only(path: str) -> io.FileIO:
    handle = io.FileIO(os.open(path, _OPEN_FLAGS), "rb")
    handle.name = path
    return handle


# -- the reader ----------------------------------------------------------------------------


class ProgressiveReader(io.RawIOBase):
    """A read-only, seekable raw file over a fill in flight: a read waits for the block it
    starts in to be verified and returns at most the verified run from there.

    ``reopen()`` gives another raw file of the same object when the followed fill is gone
    (this process then fills it, follows another fill, or reads the published copy).
    """

    def __init__(
        self,
        file: io.FileIO,
        size: int,
        progress: LocalFill | RecordFollower | _Complete,
        reopen: Callable[[], io.RawIOBase],
    ) -> None:
        super().__init__()
        self._file = file
        self.size = size
        self._progress = progress
        self._reopen = reopen
        self._position = 0
        self.name = file.name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("read of a closed file")
        if self._position >= self.size:
            return 0
        end = self._readable_end(self._position)
        view = memoryview(buffer).cast("B")
        count = min(len(view), end - self._position)
        got = os.preadv(self._file.fileno(), [view[:count]], self._position)
        if got == 0:
            raise OSError(
                errno.EIO, f"{self.name} ends at byte {self._position}, short of a verified block"
            )
        self._position += got
        if self._position >= self.size and isinstance(self._progress, LocalFill):
            self._progress.ended.wait()  # published: nothing of the fill writes after this
        return got

    def readall(self) -> bytes:
        """The rest of the file, read in verified runs (not io's 8 KiB pieces)."""
        buffer = bytearray(max(0, self.size - self._position))
        view = memoryview(buffer)
        filled = 0
        while filled < len(buffer):
            filled += self.readinto(view[filled:])
        return bytes(buffer)

    def _readable_end(self, offset: int) -> int:
        while True:
            try:
                return self._progress.readable_end(offset)
            except FillerGone as gone:
                logger.info(
                    "the fill of %s that this reader followed ended (%s): reading anew",
                    self.name,
                    gone,
                )
                self._adopt(self._reopen())

    def _adopt(self, other: io.RawIOBase) -> None:
        """Read from ``other`` (a raw file of the same object) from now on."""
        if isinstance(other, ProgressiveReader):
            file, progress = other._file, other._progress
            other._file = None  # now ours
        else:
            file, progress = other, _Complete(self.size)
        self._file.close()
        self._file = file
        self._progress = progress

    def wait_until_cached(self) -> None:
        """Wait for the fill to end: the object is then cached (or could not be: the
        fill's failure is raised)."""
        progress = self._progress
        if isinstance(progress, LocalFill):
            progress.wait_until_ended()
        elif isinstance(progress, RecordFollower):
            if self.size:
                self._readable_end(self.size - 1)
            while not locks.is_free(progress.lock_path):
                time.sleep(_POLL_MAX_SECONDS)

    def settle(self) -> None:
        """Wait for the fill of this process that this reader follows, if any, to end
        (published or failed: its outcome is not raised here)."""
        if isinstance(self._progress, LocalFill):
            self._progress.ended.wait()

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a file being filled has no descriptor to hand out")

    def close(self) -> None:
        if not self.closed and self._file is not None:
            self._file.close()
        super().close()


# -- opening: follow a fill in flight, or start one ---------------------------------------


def open_while_filling(
    cache: Any,
    obj: Any,
    blocks: BlockList,
    fill: Callable[[BinaryIO, BlockProgress], dict],
    since: int | None,
    reopen: Callable[[], io.RawIOBase],
) -> io.RawIOBase:
    """The object open for reading from the cache, while it is being filled if it is.

    Follows a fill of this process or another one when there is one; else starts the cache's
    single-flight fetch on a thread of its own, whose download is ``fill(temp file,
    progress)``, and returns a reader of its verified blocks as soon as the temp file exists
    (or the fetch's own result: the published file another process just made). Errors of
    the fetch before the fill starts (cache full, written meanwhile, ...) are raised here.
    """
    following = _follow(cache, obj, blocks, reopen)
    if following is not None:
        return following
    fetch = _FetchOnAThread(cache, obj, blocks, fill, since)
    while not fetch.started.wait(_LOCK_CHECK_SECONDS):
        following = _follow(cache, obj, blocks, reopen)  # a fill that began meanwhile
        if following is not None:
            fetch.abandon()
            return following
    local = fetch.local
    if local is None:
        if fetch.error is not None:
            raise fetch.error
        return fetch.handle
    try:
        file = _open_read_only(local.temp_path)
    except FileNotFoundError:  # the fill ended already, its temp file gone: its outcome
        local.ended.wait()
        if local.progress.failure is not None:
            raise local.progress.failure from None
        return reopen()
    return ProgressiveReader(file, blocks.size, local, reopen)


def close_settled(raw: io.RawIOBase) -> None:
    """Close ``raw`` (what :func:`open_while_filling` returned) once the fill of this process
    it follows, if any, ended: what a caller that gives it up for another failure needs
    (the fill stopped: its temp file is gone and the key's lock free when this returns)."""
    if isinstance(raw, ProgressiveReader):
        raw.settle()
    raw.close()


class _FetchOnAThread:
    """The cache's single-flight fetch of one object, run on a thread of its own; ``started``
    is set once it came to something: a fill here (``local``), the published file
    (``handle``) or an ``error``."""

    def __init__(
        self,
        cache: Any,
        obj: Any,
        blocks: BlockList,
        fill: Callable[[BinaryIO, BlockProgress], dict],
        since: int | None,
    ) -> None:
        self.cache = cache
        self.obj = obj
        self.blocks = blocks
        self.fill = fill
        self.since = since
        self.started = threading.Event()
        self.local: LocalFill | None = None
        self.handle: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        threading.Thread(target=self._run, name="fsspec-shards-fill", daemon=True).start()

    def abandon(self) -> None:
        """The opener follows another fill: a published file this fetch returns is closed."""
        with _FILLS_LOCK:
            self.abandoned = True
        if self.handle is not None:
            self.handle.close()

    def _fill_here(self, out: BinaryIO) -> dict:
        """The cache's download callback: the fill, published to readers as it goes."""
        key = self.obj.key
        record = ProgressRecord(self.cache.directory, key, out.name)
        progress = BlockProgress(self.blocks, record)
        local = LocalFill(progress, out.name, record)
        with _FILLS_LOCK:
            _FILLS[(os.getpid(), self.cache.directory, key)] = local
        self.local = local
        record.write(progress, "filling")
        self.started.set()
        try:
            metadata = self.fill(out, progress)
        except BaseException as exc:
            progress.fail(exc)
            raise
        progress.mark_all()
        return metadata

    def _run(self) -> None:
        try:
            handle = self.cache.fetch(
                self.obj, self._fill_here, expected_size=self.blocks.size, since=self.since
            )
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            if self.local is not None:
                self.local.progress.fail(exc)
            self.started.set()
            return
        finally:
            _forget(self.cache.directory, self.obj.key, self.local)
            if self.local is not None:
                self.local.ended.set()
        with _FILLS_LOCK:
            if self.local is not None or self.abandoned:
                handle.close()
            else:
                self.handle = handle
        self.started.set()


def _forget(directory: str, key: str, local: LocalFill | None) -> None:
    """The fill ended (published or failed): new readers go to the cache, and the record
    goes (a failure's record stays for followers to read; the next miss removes it)."""
    if local is None:
        return
    with _FILLS_LOCK:
        if _FILLS.get((os.getpid(), directory, key)) is local:
            del _FILLS[(os.getpid(), directory, key)]
    if local.progress.failure is None:
        local.record.remove()


def _follow(
    cache: Any, obj: Any, blocks: BlockList, reopen: Callable[[], io.RawIOBase]
) -> ProgressiveReader | None:
    """A reader following a fill of ``obj`` in flight, in this process or another; None
    when there is none to follow."""
    with _FILLS_LOCK:
        local = _FILLS.get((os.getpid(), cache.directory, obj.key))
    if local is not None and local.progress.failure is None:
        try:
            file = _open_read_only(local.temp_path)
        except FileNotFoundError:  # published meanwhile
            return None
        cache.incr("hits")
        return ProgressiveReader(file, blocks.size, local, reopen)
    follower = _record_follower(cache.directory, obj, blocks)
    if follower is None:
        return None
    try:
        file = _open_read_only(layout.temp_path(cache.directory, follower.temp_name))
    except FileNotFoundError:
        return None
    cache.incr("hits")
    return ProgressiveReader(file, blocks.size, follower, reopen)


def _record_follower(directory: str, obj: Any, blocks: BlockList) -> RecordFollower | None:
    """Another process's fill of ``obj`` as its progress record shows it, if one is filling
    (its record says so, describes these blocks, names a temp file, and its lock is held)."""
    key = obj.key
    record_path = layout.temp_path(directory, layout.progress_name(key))
    record = read_record(record_path)
    if record is None or record.get("state") != "filling" or record.get("size") != blocks.size:
        return None
    if record.get("block_size") != blocks.block_size:
        return None
    lock_path = layout.key_lock_path(directory, key)
    temp_name = record.get("temp")
    if not isinstance(temp_name, str) or layout.parse_temp_name(temp_name) is None:
        return None
    if locks.is_free(lock_path):
        return None  # its filler is gone: the record is a leftover
    return RecordFollower(record_path, lock_path, temp_name, blocks, obj.shown)
