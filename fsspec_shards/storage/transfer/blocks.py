"""Reading while the cache fills: each block handed out as soon as it is verified.

With a block manifest entry for an object (:class:`~fsspec_shards.checksums.BlockList`: a
SHA-256 per block), a cold object need not be whole before a reader starts:

- The fill (:func:`fill_blocks`) writes the object into the cache's temp file and checks
  each block against its digest the moment its last byte arrives. A good block is marked
  verified in a :class:`BlockProgress`; a bad one stops the request it came in, is counted
  in ``integrity_failures`` and fetched again by range from its first byte; a block bad in
  :data:`~fsspec_shards.storage.transfer.one_stream.INTEGRITY_PASSES` downloads raises
  ``IntegrityError`` naming the object and the block. With several ranges in flight, blocks
  complete out of order; the range holding the block a reader of this process waits on is
  fetched next. The first range is small (``range_plan.FIRST_BYTES``) and its answer decides
  whether more streams start: a server that ignores Range (a 200 to a range request) gets
  one stream, which asks for all the blocks left in one request, so the object crosses the
  link about once instead of once per range.
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
- A block manifest only checks bytes earlier, never instead of the whole file
  (``verification.py``): the fill hashes the whole file on the same pass (a worker thread
  reads back each run of verified blocks as it completes, with every expected algorithm),
  and the last block is marked verified only when the whole file matched every checksum
  known for it. A whole-file mismatch is an ``IntegrityError`` naming both manifests;
  readers never reach the file's end. Answers need not prove their version here
  (``Version.blocks_checked``): every block is checked against its digest.
- The cache's own rules stand: the entry is published (fsynced, renamed, indexed) only when
  the whole object is verified; a kill at any instant leaves a temp file and a record, both
  removed by name on the next miss, never a partial entry.
- With ``cache=False``, :class:`BlockCheckedFile` applies the same block rule to streamed
  reads. Without a block manifest none of this applies: the object is verified whole first.
"""

from __future__ import annotations

import errno
import hashlib
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
from fsspec_shards.redact import raising_clean
from fsspec_shards.storage.backends.versions import Version, VersionMismatch
from fsspec_shards.storage.cache import layout, locks
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.core.verification import Expectation, Known, WholeHasher
from fsspec_shards.storage.files import RetryingFile
from fsspec_shards.storage.transfer.one_stream import INTEGRITY_PASSES, read_range
from fsspec_shards.storage.transfer.range_plan import FIRST_BYTES, Ramp, Stopped, run_stream
from fsspec_shards.storage.transfer.ranges import Frontier, OrderedHasher, preallocate, pwrite_all
from fsspec_shards.storage.transfer.target import FillRate, Target, resume

logger = logging.getLogger("fsspec_shards.storage.transfer.blocks")

RECORD_INTERVAL_SECONDS = 0.01
"""At most this often the progress record is replaced while blocks verify (the last block
and a failure are always written at once)."""
_POLL_FIRST_SECONDS = 0.002
_POLL_MAX_SECONDS = 0.02
_LOCK_CHECK_SECONDS = 0.2
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
SPAN_BYTES = 16 * 1024 * 1024
"""Bytes per ranged GET when a fill has several in flight (whole blocks: rounded up)."""
_RAMP_SECONDS = 0.3
_FILLS: dict[tuple[int, str, str], BlockProgress] = {}
"""This process's fills in flight by (pid, cache directory, key): its readers wait on them
directly. Keyed by pid: a forked child sees its parent's entries, whose threads it lacks."""
_FILLS_LOCK = threading.Lock()


class FillerGone(Exception):
    """The fill a reader followed ended without finishing (killed, or failed over there)."""


# -- progress: which blocks are verified ---------------------------------------------------


class BlockProgress:
    """Which blocks of one fill are verified: written by the fill, read by this process's
    readers (who wait on a condition) and, through the record, by other processes."""

    def __init__(self, blocks: BlockList, temp_path: str, record: ProgressRecord | None) -> None:
        self.blocks = blocks
        self.temp_path = temp_path
        self.record = record
        self.verified = bytearray(len(blocks))
        self.failure: BaseException | None = None
        self.wanted: int | None = None
        """The block a reader waits on: the next range to fetch is the one holding it."""
        self._done = 0
        self.ended = threading.Event()
        """Set when the cache's fetch around this fill returned (published) or raised."""
        self._condition = threading.Condition()
        self._recorded_at = 0.0

    @property
    def complete(self) -> bool:
        return self._done == len(self.blocks)

    def mark(self, index: int) -> None:
        """Block ``index`` is written and matches its digest."""
        with self._condition:
            if not self.verified[index]:
                self.verified[index] = 1
                self._done += 1
            self._condition.notify_all()
        self._write_record(force=self.complete)

    def mark_all(self) -> None:
        """Every block is verified (the whole object was, e.g. copied from the shared tier)."""
        with self._condition:
            self.verified[:] = b"\x01" * len(self.blocks)
            self._done = len(self.blocks)
            self._condition.notify_all()
        self._write_record(force=True)

    def fail(self, error: BaseException) -> None:
        """The fill ended without verifying every block: readers waiting get ``error``."""
        with self._condition:
            if self.failure is None and not self.complete:
                self.failure = error
            self._condition.notify_all()
        if self.record is not None and not self.complete:
            self.record.write(self, "failed", error)

    def readable_end(self, offset: int) -> int:
        """Wait until the block holding ``offset`` is verified; the end of the verified run
        from there (bytes ``[offset, end)`` may be handed out)."""
        index = self.blocks.block_at(offset)
        with self._condition:
            while not self.verified[index]:
                if self.failure is not None:
                    raise self.failure
                self.wanted = index
                self._condition.wait(1.0)
            return _run_end(self.blocks, self.verified, index)

    def wait_first(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until some block is verified, or the fill failed."""
        with self._condition:
            self._condition.wait_for(lambda: self._done or self.failure, timeout)

    def next_wanted(self) -> int | None:
        """The block a reader waits on, if any and not verified yet."""
        wanted = self.wanted
        return None if wanted is None or self.verified[wanted] else wanted

    def _write_record(self, force: bool) -> None:
        if self.record is None:
            return
        now = time.monotonic()
        if force or now - self._recorded_at >= RECORD_INTERVAL_SECONDS:
            self._recorded_at = now
            self.record.write(self, "filling")


def _run_end(blocks: BlockList, verified: Any, index: int) -> int:
    """The end byte of the run of verified blocks starting at ``index``."""
    end = index
    while end < len(blocks) and verified[end]:
        end += 1
    return blocks.bounds(end - 1)[1]


class ProgressRecord:
    """``tmp/<key>.progress``: the fill's state for other processes, replaced atomically.

    JSON: ``{"temp": <temp file name>, "size", "block_size", "state": "filling"|"failed",
    "verified": [[first, end], ...] (runs of verified block indices), "error", "integrity"}``.
    It is advice to live readers only: trusted while the key's lock is held and the temp
    file it names exists; never fsynced (a crash leaves no reader to advise).
    """

    def __init__(self, directory: str, key: str, temp_path: str) -> None:
        self.directory = os.path.join(directory, layout.TMP)
        self.key = key
        self.path = os.path.join(self.directory, layout.progress_name(key))
        self.temp_name = os.path.basename(temp_path)
        self._lock = threading.Lock()

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
            staging = os.path.join(self.directory, layout.new_progress_name(self.key))
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
        return _run_end(self.blocks, self.verified, index)


class _Complete:
    """A published, whole file: everything may be read."""

    def __init__(self, size: int) -> None:
        self.size = size

    def readable_end(self, offset: int) -> int:
        return self.size


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
        progress: BlockProgress | RecordFollower | _Complete,
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
        if isinstance(progress, BlockProgress):
            progress.ended.wait()
            if progress.failure is not None:
                raise progress.failure
        elif isinstance(progress, RecordFollower):
            if self.size:
                self._readable_end(self.size - 1)
            while not locks.is_free(progress.lock_path):
                time.sleep(_POLL_MAX_SECONDS)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a file being filled has no descriptor to hand out")

    def close(self) -> None:
        if not self.closed and self._file is not None:
            self._file.close()
        super().close()


def _open_read_only(path: str) -> io.FileIO:
    handle = io.FileIO(os.open(path, _OPEN_FLAGS), "rb")
    handle.name = path
    return handle


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
    started = threading.Event()
    outcome: dict[str, Any] = {}
    key = obj.key

    def fill_here(out: BinaryIO) -> dict:
        record = ProgressRecord(cache.directory, key, out.name)
        progress = BlockProgress(blocks, out.name, record)
        with _FILLS_LOCK:
            _FILLS[(os.getpid(), cache.directory, key)] = progress
        outcome["progress"] = progress
        record.write(progress, "filling")
        started.set()
        try:
            metadata = fill(out, progress)
        except BaseException as exc:
            progress.fail(exc)
            raise
        progress.mark_all()
        return metadata

    def run() -> None:
        try:
            handle = cache.fetch(obj, fill_here, expected_size=blocks.size, since=since)
        except BaseException as exc:
            outcome.setdefault("error", exc)
            progress = outcome.get("progress")
            if progress is not None:
                progress.fail(exc)
            started.set()
            return
        finally:
            _forget(cache.directory, key, outcome.get("progress"))
            if outcome.get("progress") is not None:
                outcome["progress"].ended.set()
        with _FILLS_LOCK:
            if "progress" in outcome or outcome.get("abandoned"):
                handle.close()
            else:
                outcome["handle"] = handle
        started.set()

    threading.Thread(target=run, name="fsspec-shards-fill", daemon=True).start()
    while not started.wait(_LOCK_CHECK_SECONDS):
        following = _follow(cache, obj, blocks, reopen)  # a fill that began meanwhile
        if following is not None:
            with _FILLS_LOCK:
                outcome["abandoned"] = True
            if "handle" in outcome:
                outcome["handle"].close()
            return following
    progress = outcome.get("progress")
    if progress is None:
        if "error" in outcome:
            raise outcome["error"]
        return outcome["handle"]
    try:
        file = _open_read_only(progress.temp_path)
    except FileNotFoundError:  # the fill ended already, its temp file gone: its outcome
        progress.ended.wait()
        if progress.failure is not None:
            raise progress.failure from None
        return reopen()
    return ProgressiveReader(file, blocks.size, progress, reopen)


def _forget(directory: str, key: str, progress: BlockProgress | None) -> None:
    """The fill ended (published or failed): new readers go to the cache, and the record
    goes (a failure's record stays for followers to read; the next miss removes it)."""
    if progress is None:
        return
    with _FILLS_LOCK:
        if _FILLS.get((os.getpid(), directory, key)) is progress:
            del _FILLS[(os.getpid(), directory, key)]
    if progress.failure is None and progress.record is not None:
        progress.record.remove()


def _follow(
    cache: Any, obj: Any, blocks: BlockList, reopen: Callable[[], io.RawIOBase]
) -> ProgressiveReader | None:
    """A reader following a fill of ``obj`` in flight, in this process or another; None
    when there is none to follow."""
    key = obj.key
    with _FILLS_LOCK:
        progress = _FILLS.get((os.getpid(), cache.directory, key))
    if progress is not None and progress.failure is None:
        try:
            file = _open_read_only(progress.temp_path)
        except FileNotFoundError:  # published meanwhile
            return None
        cache.incr("hits")
        return ProgressiveReader(file, blocks.size, progress, reopen)
    temp = os.path.join(cache.directory, layout.TMP)
    record_path = os.path.join(temp, layout.progress_name(key))
    record = read_record(record_path)
    if record is None or record.get("state") != "filling" or record.get("size") != blocks.size:
        return None
    if record.get("block_size") != blocks.block_size:
        return None
    lock_path = os.path.join(cache.directory, layout.LOCKS, layout.key_lock_name(key))
    temp_name = record.get("temp")
    if not isinstance(temp_name, str) or layout.parse_temp_name(temp_name) is None:
        return None
    if locks.is_free(lock_path):
        return None  # its filler is gone: the record is a leftover
    try:
        file = _open_read_only(os.path.join(temp, temp_name))
    except FileNotFoundError:
        return None
    cache.incr("hits")
    follower = RecordFollower(record_path, lock_path, temp_name, blocks, obj.shown)
    return ProgressiveReader(file, blocks.size, follower, reopen)


# -- the fill ------------------------------------------------------------------------------


class _BadBlock(Exception):
    """A block's bytes did not match its digest (raised from a sink: its request ends)."""

    def __init__(self, index: int, actual: str) -> None:
        super().__init__(index)
        self.index = index
        self.actual = actual


class _Plan:
    """The spans of blocks left to fetch: taken front to back, except that the span holding
    the block a reader waits on goes first. The first span holds ``first_blocks`` blocks
    (a span whose answer decides whether ranges are honoured), the others ``span_blocks``."""

    def __init__(
        self, blocks: BlockList, progress: BlockProgress, span_blocks: int, first_blocks: int
    ) -> None:
        self.progress = progress
        starts = [0, *range(first_blocks, len(blocks), span_blocks)]
        self.spans = [
            (first, min(len(blocks), following))
            for first, following in zip(starts, [*starts[1:], len(blocks)], strict=True)
            if first < len(blocks)
        ]
        self.empty = threading.Event()
        """Set once every span was taken (or the fill failed)."""
        self._lock = threading.Lock()

    def take(self, rest: bool = False) -> tuple[int, int] | None:
        """The next span; with ``rest``, merged with the spans that follow it without a gap
        (one request for them all: a server that ignores Range sends each from byte 0)."""
        with self._lock:
            if not self.spans:
                self.empty.set()
                return None
            wanted = self.progress.next_wanted()
            chosen = 0
            if wanted is not None:
                chosen = next(
                    (i for i, (first, end) in enumerate(self.spans) if first <= wanted < end), 0
                )
            first, end = self.spans.pop(chosen)
            while rest and chosen < len(self.spans) and self.spans[chosen][0] == end:
                end = self.spans.pop(chosen)[1]
            if not self.spans:
                self.empty.set()
            return first, end


def fill_blocks(
    target: Target,
    out: BinaryIO,
    info: dict[str, Any],
    blocks: BlockList,
    progress: BlockProgress,
    ranges_in_flight: int | str = 1,
    range_bytes: int = SPAN_BYTES,
) -> dict[str, Any]:
    """Write the object into the file ``out``, checking every block against ``blocks`` as it
    completes and marking it in ``progress`` (module docstring). Returns the metadata a
    download returns (``size``, ``identity``, ``checksum``).

    With ``ranges_in_flight`` other than 1 the object is fetched as spans of about
    ``range_bytes`` (whole blocks), as many at a time as ``range_plan.Ramp`` allows (the
    same rule as whole-object fills; every block is verified on its own, so ranges need no
    version identity here); all but the first start once the first block is verified (or
    after a moment), so the reader's first block has the link to itself.
    The whole file is hashed on the same pass and checked against every checksum known
    (``verification.py``); the last block is marked only then.
    Raises ``IntegrityError`` when the object's size is not the manifest's, a block stays
    bad, or the whole file does not match, and the failure that ended a transfer.
    """
    state = _FillState(target, info, blocks, progress)
    if state.expect.size is not None and state.expect.size != blocks.size:
        target.incr("integrity_failures")
        raise IntegrityError(
            target.shown,
            f"{blocks.size} bytes (block manifest)",
            f"{state.expect.size} bytes",
            "the object is not the one the block manifest lists",
        )
    descriptor = out.fileno()
    out.flush()
    preallocate(descriptor, blocks.size)
    expected = _whole_file_expectation(target, info, blocks)
    hasher = OrderedHasher(expected.algorithms)
    hasher.update_from_file(descriptor, 0, blocks.size, state.in_order)
    try:
        _fetch_blocks(state, descriptor, ranges_in_flight, range_bytes)
        computed = hasher.checksums()
    except BaseException:
        hasher.abandon()
        raise
    mismatch = expected.mismatch(computed)
    if mismatch is not None:
        target.incr("integrity_failures")
        raise IntegrityError(
            target.shown,
            mismatch.expected,
            mismatch.actual,
            f"expected by {mismatch.source}; every block matched "
            f"{expected.sources_of(blocks.checksum)}, the whole file does not: the manifests "
            "describe other bytes than these; nothing was published",
        )
    if len(blocks):  # the last block, held back until the whole file checked out
        progress.mark(len(blocks) - 1)
    return {
        "size": blocks.size,
        "identity": state.target.identity(state.info),
        "checksum": str(expected.strongest()),
    }


def _whole_file_expectation(target: Target, info: dict[str, Any], blocks: BlockList) -> Expectation:
    """Every checksum the whole file must have (``verification.py``): the manifests' and
    the backend's, the block manifest's whole-file SHA-256 among them."""
    expected = target.expectation(info)
    if blocks.checksum in expected.checksums:
        return expected
    return Expectation((*expected.known, Known(blocks.checksum, "the block manifest")))


def _fetch_blocks(
    state: _FillState, descriptor: int, ranges_in_flight: int | str, range_bytes: int
) -> None:
    """Every block of the object written into ``descriptor`` and verified (see
    :func:`fill_blocks`); raises what ended the fill."""
    target, blocks, progress = state.target, state.blocks, state.progress
    span_blocks = max(1, -(-range_bytes // blocks.block_size))
    ramp = Ramp(ranges_in_flight, target.link, target.plan_dir)
    workers = max(1, min(ramp.cap, -(-len(blocks) // span_blocks)))
    if workers == 1:
        span_blocks = max(1, len(blocks))
    # whether worker 0's first span is still to say if the server honours ranges
    deciding = [workers > 1 and ramp.gated]
    first_blocks = span_blocks
    if deciding[0]:
        first_blocks = min(span_blocks, max(1, -(-FIRST_BYTES // blocks.block_size)))
    plan = _Plan(blocks, progress, span_blocks, first_blocks)
    stop = threading.Event()
    failures: list[BaseException] = []

    def take() -> tuple[int, int] | None:
        return plan.take(rest=ramp.cap == 1)  # (ranges ignored: the rest in one request)

    def fetch(number: int, span: tuple) -> None:
        moved = lambda amount: ramp.moved(number, amount)  # noqa: E731
        status = _fill_span(state, descriptor, *span, stop, moved)
        if number == 0 and deciding[0]:
            deciding[0] = False
            ramp.ranges_answered(status == 206)

    def work(number: int) -> None:
        if number:
            progress.wait_first(_RAMP_SECONDS)  # the reader's first block: the link alone
        run_stream(ramp, number, take, fetch, stop, failures, plan.empty)

    try:
        if workers == 1:
            work(0)
        else:
            threads = [
                threading.Thread(
                    target=work, args=(n,), name=f"fsspec-shards-blocks-{n}", daemon=True
                )
                for n in range(workers)
            ]
            for thread in threads:
                thread.start()
            try:
                ramp.steer(plan.empty)  # (from the first span's answer on, if it must wait)
                plan.empty.wait()
            finally:
                ramp.close()
                for thread in threads:
                    thread.join()
    finally:
        target.incr("bytes_downloaded", state.received)
    if failures:
        integrity = next((f for f in failures if isinstance(f, IntegrityError)), None)
        raise integrity or failures[0]
    if state.in_order.value < blocks.size:  # (every span was fetched: needs a failure)
        raise TransientError(f"{target.shown}: blocks left unverified")


class _FillState:
    """What the ranges of one fill share: the version expected, bad-block counts, bytes,
    which blocks are verified (``in_order``: how far from byte 0 all are, for the
    whole-file hash that follows them)."""

    def __init__(
        self, target: Target, info: dict[str, Any], blocks: BlockList, progress: BlockProgress
    ) -> None:
        self.target = target
        self.blocks = blocks
        self.progress = progress
        self.info = info
        self.expect = self._expected_version()
        self.in_order = Frontier(0)
        self._verified = bytearray(len(blocks))
        self._first_unverified = 0
        self.bad: dict[int, int] = {}
        self.changes = 0
        self.received = 0
        self.rate = FillRate()  # (min_rate is the fill's: transfer.py)
        self.lock = threading.Lock()

    def _expected_version(self) -> Version:
        expect = self.target.expected_version(self.info)
        expect.blocks_checked = True  # every block is checked: answers need not prove it
        return expect

    def count(self, amount: int) -> None:
        with self.lock:
            self.received += amount

    def verified(self, index: int) -> None:
        """Block ``index`` is written and matches its digest: handed out at once, except
        the last, which waits for the whole file's check (:func:`fill_blocks`)."""
        with self.lock:
            self._verified[index] = 1
            while (
                self._first_unverified < len(self.blocks) and self._verified[self._first_unverified]
            ):
                self._first_unverified += 1
            first = self._first_unverified
        if first:
            self.in_order.advance(self.blocks.bounds(first - 1)[1])
        if index != len(self.blocks) - 1:
            self.progress.mark(index)

    def bad_block(self, index: int, actual: str) -> None:
        """Count a bad block; ``IntegrityError`` when it was bad too often."""
        with self.lock:
            self.bad[index] = times = self.bad.get(index, 0) + 1
        self.target.incr("integrity_failures")
        start, end = self.blocks.bounds(index)
        where = f"block {index} (bytes {start}-{end})"
        if times >= INTEGRITY_PASSES:
            raise IntegrityError(
                self.target.shown,
                f"sha256:{self.blocks.blocks[index]}",
                f"sha256:{actual}",
                f"{where}, after {times} downloads; nothing past it was handed out",
            )
        logger.warning(
            "integrity check failed for %s %s: fetching the block again", self.target.shown, where
        )

    def changed(self, error: VersionMismatch) -> None:
        """The object changed under the fill: verified blocks stay (they match the
        manifest); the rest is read from the version there now."""
        with self.lock:
            self.changes += 1
            if self.changes >= self.target.policy.attempts:
                raise OSError(
                    errno.ESTALE,
                    f"{self.target.shown} changed {self.changes} times while it was read",
                )
            logger.warning(
                "%s changed while it was being read (%s): reading on from the new version",
                self.target.shown,
                error.strerror or error,
            )
            self.info = self.target.stat()
            self.expect = self._expected_version()


def _fill_span(
    state: _FillState,
    descriptor: int,
    first: int,
    last: int,
    stop: threading.Event,
    moved: Callable[[int], None],
) -> int | None:
    """Blocks ``[first, last)`` written at their place and verified one by one; resumed
    from the byte reached after a fault (``transfer.resume``), from a bad block's first byte
    after a mismatch; one stream of the fill (the rate floor is the fill's). Returns the
    HTTP status of the last answer (206: the range honoured; None: the transport cannot
    say)."""
    target, blocks = state.target.in_fill(state.rate), state.blocks
    end = blocks.bounds(last - 1)[1]
    index = first
    position = blocks.bounds(first)[0]
    block_end = blocks.bounds(first)[1]
    hasher = hashlib.sha256()

    def sink(data: bytes) -> None:
        nonlocal index, position, block_end, hasher
        if stop.is_set():
            raise Stopped
        view = memoryview(data)
        while view and index < last:
            piece = view[: block_end - position]
            pwrite_all(descriptor, piece, position)
            hasher.update(piece)
            position += len(piece)
            state.count(len(piece))
            moved(len(piece))
            view = view[len(piece) :]
            if position == block_end:
                actual = hasher.hexdigest()
                if actual != blocks.blocks[index]:
                    raise _BadBlock(index, actual)
                state.verified(index)
                index += 1
                hasher = hashlib.sha256()
                if index < last:
                    block_end = blocks.bounds(index)[1]

    def after_fault() -> None:
        if stop.is_set():  # a request that failed after another span did: no retry
            raise Stopped

    status = None
    while index < last:
        try:
            moved_on = resume(
                target,
                position,
                end,
                sink,
                state.expect,
                after_fault=after_fault,
                passthrough=(_BadBlock, Stopped),
            )
            status = getattr(moved_on.facts, "status", None)
        except _BadBlock as bad:
            state.bad_block(bad.index, bad.actual)
            position, block_end = blocks.bounds(bad.index)
            hasher = hashlib.sha256()
        except VersionMismatch as exc:
            state.changed(exc)
            position, block_end = blocks.bounds(index)
            hasher = hashlib.sha256()
    return status


# -- cache=False: the block rule on streamed reads -----------------------------------------


class BlockCheckedFile(RetryingFile):
    """A streamed (uncached) file whose reads are checked block by block: each read fetches
    the whole blocks it touches and hands out only what matches the block manifest; a bad
    block is fetched again, and ``IntegrityError`` names it when it stays bad."""

    def __init__(
        self, wds: Any, target: Target, info: dict, block_size: int, blocks: BlockList
    ) -> None:
        self.blocks = blocks
        self._held: dict[int, bytes] = {}
        if info.get("size") != blocks.size:
            target.incr("integrity_failures")
            raise IntegrityError(
                target.shown,
                f"{blocks.size} bytes (block manifest)",
                f"{info.get('size')} bytes",
                "the object is not the one the block manifest lists",
            )
        super().__init__(wds, target, info, max(block_size, blocks.block_size))
        self.version.blocks_checked = True  # every block is checked: answers need no proof
        self._expected = _whole_file_expectation(target, info, blocks)
        self._hasher = WholeHasher(self._expected.algorithms)

    @raising_clean
    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if start >= end:
            return b""
        first, last = self.blocks.block_at(start), self.blocks.block_at(end - 1)
        pieces = self._blocks(first, last + 1)
        self._held = {index: pieces[index - first] for index in (first, last)}
        offset = self.blocks.bounds(first)[0]
        data = b"".join(pieces)[start - offset : end - offset]
        self._hash(start, data)  # read start to end: the whole file is checked too
        return data

    def _blocks(self, first: int, last: int) -> list[bytes]:
        """Blocks ``[first, last)``, verified: the ones not held read in one request, a bad
        one read again on its own."""
        held = [self._held.get(index) for index in range(first, last)]
        missing = [first + i for i, data in enumerate(held) if data is None]
        if missing:
            begin, end = self.blocks.bounds(missing[0])[0], self.blocks.bounds(missing[-1])[1]
            data = self._read(begin, end)
            for index in missing:
                start, stop = self.blocks.bounds(index)
                held[index - first] = self._verified(index, data[start - begin : stop - begin])
        return held

    def _read(self, start: int, end: int) -> bytes:
        return read_range(
            self.target, start, end, self.version, lambda n: self.target.incr("bytes_downloaded", n)
        )

    def _verified(self, index: int, data: bytes) -> bytes:
        """Block ``index`` as listed: ``data`` if it matches, else read again (until the
        passes are spent: then ``IntegrityError`` naming the block)."""
        start, end = self.blocks.bounds(index)
        for passes in range(1, INTEGRITY_PASSES + 1):
            actual = hashlib.sha256(data).hexdigest()
            if actual == self.blocks.blocks[index]:
                return data
            self.target.incr("integrity_failures")
            if passes == INTEGRITY_PASSES:
                raise IntegrityError(
                    self.target.shown,
                    f"sha256:{self.blocks.blocks[index]}",
                    f"sha256:{actual}",
                    f"block {index} (bytes {start}-{end}), after {passes} downloads, streamed "
                    "without cache; nothing past it was handed out",
                )
            logger.warning(
                "integrity check failed for %s block %d: fetching it again",
                self.target.shown,
                index,
            )
            data = self._read(start, end)
        raise AssertionError("unreachable")
