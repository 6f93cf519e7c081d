"""Block-checked fills: each block verified the moment its last byte arrives.

With a block manifest entry for an object (:class:`~fsspec_shards.checksums.BlockList`: a
SHA-256 per block), a cold object need not be whole before a reader starts:

- The fill (:func:`fill_blocks`) writes the object into the cache's temp file and checks
  each block against its digest the moment its last byte arrives. A good block is marked
  verified in a ``block_progress.BlockProgress``; a bad one stops the request it came in, is counted
  in ``integrity_failures`` and fetched again by range from its first byte; a block bad in
  :data:`~fsspec_shards.storage.transfer.one_stream.INTEGRITY_PASSES` downloads raises
  ``IntegrityError`` naming the object and the block. With several ranges in flight, blocks
  complete out of order; the range holding the block a reader waits on is fetched next.
  The first block, which a reader waits for, is asked as concurrent pieces where ranges
  may pay (``first_block.py``). Their answers (or the first span's, then small:
  ``range_plan.FIRST_BYTES``) decide whether more streams start: a server that ignores
  Range (a 200 to a range request) gets one stream, which asks for all the blocks left in
  one request, so the object crosses the link about once instead of once per range.
- Readers wait on the ``BlockProgress`` and never read past a block that is not
  verified; the cache publishes it to other processes (``cache/following.py``, through a
  ``block_progress.ProgressListener``).
- A block manifest only checks bytes earlier, never instead of the whole file
  (``verification.py``): the fill hashes the whole file on the same pass
  (``whole_file.py``: a worker thread
  reads back each run of verified blocks as it completes, with every expected algorithm),
  and the last block is marked verified only when the whole file matched every checksum
  known for it. A whole-file mismatch is an ``IntegrityError`` naming both manifests;
  readers never reach the file's end. Answers need not prove their version here
  (``Version.blocks_checked``): every block is checked against its digest.
- The block manifest gives the object's size, so a fill may start before the object's
  ``info()`` (its HEAD) is in, which then runs beside its first requests: one round trip
  for a cold file, not two. Until it is in, the first answer names the version and the
  others must agree with it (``versions.py``); once in, its size must be the manifest's,
  its version the answers' (else the object changed, as when an answer shows another
  version), and the whole-file check takes its checksums and identity
  (``whole_file.WholeFileCheck``). A failed ``info()`` stops the fill: nothing is published.
- With ``cache=False``, ``files.BlockCheckedFile`` applies the same block rule to streamed
  reads. Without a block manifest none of this applies: the object is verified whole first.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, BinaryIO

from fsspec_shards.checksums import BlockList
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.backends.versions import Version, VersionMismatch
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.core.verification import Expectation
from fsspec_shards.storage.transfer.block_progress import BlockProgress
from fsspec_shards.storage.transfer.first_block import Piece, PiecedBlock, fetch_pieces
from fsspec_shards.storage.transfer.one_stream import Frontier, preallocate, pwrite_all
from fsspec_shards.storage.transfer.range_plan import FIRST_BYTES, Ramp, Stopped, run_stream
from fsspec_shards.storage.transfer.target import (
    INTEGRITY_PASSES,
    Expected,
    FillRate,
    Target,
    resume,
)
from fsspec_shards.storage.transfer.whole_file import WholeFileCheck, check_listed_size

logger = logging.getLogger("fsspec_shards.storage.transfer.blocks")

SPAN_BYTES = 16 * 1024 * 1024
"""Bytes per ranged GET when a fill has several in flight (whole blocks: rounded up)."""
_RAMP_SECONDS = 0.3


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
    expected: Expected | Future[dict[str, Any]],
    blocks: BlockList,
    progress: BlockProgress,
    ranges_in_flight: int | str = 1,
    range_bytes: int = SPAN_BYTES,
) -> dict[str, Any]:
    """Write the object into the file ``out``, checking every block against ``blocks`` as it
    completes and marking it in ``progress`` (module docstring). ``expected``: what the
    version must deliver (``Target.expect`` with ``blocks``), or the object's ``info()``
    still to come (``Target.stat_on_a_thread``): the fill then starts at once and takes the
    version from its first answers (:class:`WholeFileCheck`). Returns the metadata a
    download returns (``size``, ``identity``, ``checksum``).

    With ``ranges_in_flight`` other than 1 the object is fetched as spans of about
    ``range_bytes`` (whole blocks), as many at a time as ``range_plan.Ramp`` allows (the
    same rule as whole-object fills; every block is verified on its own, so ranges need no
    version identity here); all but the first start once the first block is verified (or
    after a moment), so the reader's first block has the link to itself.
    The whole file is hashed on the same pass and checked against every checksum known
    (``verification.py``); the last block is marked only then.
    Raises ``IntegrityError`` when the object's size is not the manifest's, a block stays
    bad, or the whole file does not match, the failure that ended a transfer, and that of
    an ``info()`` still to come (the fill stops).
    """
    pending = expected if isinstance(expected, Future) else None
    if pending is not None:
        version = Version(size=blocks.size)
        version.blocks_checked = True
        expected = Expected(version, Expectation(()), "")
    elif expected.version.size is not None:
        check_listed_size(target, blocks, expected.version.size)
    state = _FillState(target, expected, blocks, progress)
    descriptor = out.fileno()
    out.flush()
    preallocate(descriptor, blocks.size)
    whole = WholeFileCheck(target, blocks, descriptor, state.in_order, state.info_in)
    if pending is None:
        whole.start(expected)
    try:
        _fetch_blocks(state, descriptor, ranges_in_flight, range_bytes, whole, pending)
        computed = whole.computed()
    except BaseException:
        whole.abandon()
        raise
    checked = whole.expected
    checksums = checked.checksums
    mismatch = checksums.mismatch(computed)
    if mismatch is not None:
        target.incr("integrity_failures")
        raise IntegrityError(
            target.shown,
            mismatch.expected,
            mismatch.actual,
            f"expected by {mismatch.source}; every block matched "
            f"{checksums.sources_of(blocks.checksum)}, the whole file does not: the manifests "
            "describe other bytes than these; nothing was published",
        )
    if len(blocks):  # the last block, held back until the whole file checked out
        progress.mark(len(blocks) - 1)
    return {**checked.metadata(blocks.size), "identity": state.expected.identity}


def _fetch_blocks(
    state: _FillState,
    descriptor: int,
    ranges_in_flight: int | str,
    range_bytes: int,
    whole: WholeFileCheck,
    pending: Future[dict[str, Any]] | None,
) -> None:
    """Every block of the object written into ``descriptor`` and verified (see
    :func:`fill_blocks`); raises what ended the fill (``pending``'s failure among them)."""
    target = state.target
    ramp = Ramp(ranges_in_flight, target.link, target.plan_dir)
    streams = _Streams(state, descriptor, ramp, range_bytes)
    if pending is not None:
        whole.follow(pending, streams.failed)
    try:
        streams.run()
    finally:
        streams.pieces_ended()  # (when they were never asked)
        target.incr("bytes_downloaded", state.received)
    if streams.failures:
        failures = streams.failures
        integrity = next((f for f in failures if isinstance(f, IntegrityError)), None)
        raise integrity or failures[0]
    if state.in_order.value < state.blocks.size:  # (every span was fetched: needs a failure)
        raise TransientError(f"{target.shown}: blocks left unverified")


class _Streams:
    """The streams of one block fill: as many as the ramp allows and the spans need, each
    taking spans from the plan (``range_plan.run_stream``); while worker 0's first span is
    still to say whether the server honours ranges (``deciding``), it is a small one."""

    def __init__(self, state: _FillState, descriptor: int, ramp: Ramp, range_bytes: int) -> None:
        self.state = state
        self.descriptor = descriptor
        self.ramp = ramp
        blocks = state.blocks
        span_blocks = max(1, -(-range_bytes // blocks.block_size))
        self.workers = max(1, min(ramp.cap, -(-len(blocks) // span_blocks)))
        if self.workers == 1:
            span_blocks = max(1, len(blocks))
        self.deciding = self.workers > 1 and ramp.gated
        first_blocks = span_blocks
        if self.deciding:
            first_blocks = min(span_blocks, max(1, -(-FIRST_BYTES // blocks.block_size)))
        self.plan = _Plan(blocks, state.progress, span_blocks, first_blocks)
        self.stop = threading.Event()
        self.failures: list[BaseException] = []
        self.first_pieces = ramp.first_pieces(blocks.bounds(0)[1]) if len(blocks) else 1
        """The first block's pieces (``range_plan.Ramp.first_pieces``; 1: one request)."""

    def run(self) -> None:
        """Run every stream until the plan is empty (or one failed)."""
        if self.workers == 1:
            self._work(0)
            return
        threads = [
            threading.Thread(
                target=self._work, args=(n,), name=f"fsspec-shards-blocks-{n}", daemon=True
            )
            for n in range(self.workers)
        ]
        for thread in threads:
            thread.start()
        try:
            self.ramp.steer(self.plan.empty)  # (from the first span's answer on, if it must wait)
            self.plan.empty.wait()
        finally:
            self.ramp.close()
            for thread in threads:
                thread.join()

    def pieces_ended(self) -> None:
        """The first block's pieces ended (or were never asked): their slots go back."""
        self.ramp.pieces_ended(self.first_pieces)
        self.first_pieces = 1

    def _take(self) -> tuple[int, int] | None:
        return self.plan.take(rest=self.ramp.cap == 1)  # (ranges ignored: the rest in one)

    def _fetch(self, number: int, span: tuple) -> None:
        moved = lambda amount: self.ramp.moved(number, amount)  # noqa: E731
        if number == 0 and span[0] == 0 and self.first_pieces > 1:
            self._fetch_in_pieces(span[1], moved)
            return
        status = _fill_span(self.state, self.descriptor, *span, self.stop, moved)
        if number == 0 and self.deciding:
            self.deciding = False
            self.ramp.ranges_answered(status == 206)

    def _fetch_in_pieces(self, last: int, moved: Callable[[int], None]) -> None:
        """Blocks ``[0, last)``: block 0 as concurrent pieces, the last of them running on
        to block ``last`` (``first_block.py``); their answers are the first range's."""
        state, descriptor = self.state, self.descriptor
        block = PiecedBlock(
            state.blocks, descriptor, 0, self.first_pieces, state.verified, lambda: state.changes
        )

        def fetch(piece: Piece) -> int | None:
            until = last if piece is block.pieces[-1] else 1
            return _fill_span(state, descriptor, 1, until, self.stop, moved, piece)

        try:
            statuses = fetch_pieces(block, fetch, self.stop, self.failed)
        finally:
            self.pieces_ended()
        if self.stop.is_set():
            raise Stopped
        self.deciding = False
        self.ramp.first_answered(all(s == 206 for s in statuses), block.slowest_rate())
        if block.actual is not None:  # asked again in one request
            if not block.changed:
                state.bad_block(0, block.actual)
            _fill_span(state, descriptor, 0, 1, self.stop, moved)

    def failed(self, error: BaseException) -> None:
        """A piece, or the object's ``info()`` beside the fill, failed: the fill stops and
        raises it."""
        self.failures.append(error)
        self.stop.set()
        self.plan.empty.set()

    def _work(self, number: int) -> None:
        if number:
            self.state.progress.wait_first(_RAMP_SECONDS)  # the reader's first block: alone
        run_stream(
            self.ramp, number, self._take, self._fetch, self.stop, self.failures, self.plan.empty
        )


class _FillState:
    """What the ranges of one fill share: the version expected, bad-block counts, bytes,
    which blocks are verified (``in_order``: how far from byte 0 all are, for the
    whole-file hash that follows them)."""

    def __init__(
        self, target: Target, expected: Expected, blocks: BlockList, progress: BlockProgress
    ) -> None:
        self.target = target
        self.blocks = blocks
        self.progress = progress
        self.expected = expected
        self.in_order = Frontier(0)
        self._verified = bytearray(len(blocks))
        self._first_unverified = 0
        self.bad: dict[int, int] = {}
        self.changes = 0
        self.received = 0
        self.rate = FillRate()  # (min_rate is the fill's: target.py)
        self.lock = threading.Lock()

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

    def info_in(self, info: dict[str, Any]) -> Expected:
        """The object's ``info()`` came in beside a fill that started without it: its version
        must be the one the answers so far were of (``Version.agree``), else the object
        changed (:meth:`changed`); the fill expects what ``info()`` says from now on (the
        backend's checksums, the identity recorded). Returns that."""
        described = self.target.expect(info, self.blocks)
        with self.lock:
            version = self.expected.version
            try:
                version.agree(described.version)
            except VersionMismatch as exc:
                mismatch = exc
            else:
                self.expected = Expected(version, described.checksums, described.identity)
                return self.expected
        self.changed(mismatch)
        return self.expected

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
            self.expected = self.target.expect(self.target.stat(), self.blocks)


class _SpanSink:
    """Writes the bytes of blocks ``[first, last)`` at their place, checking each block as
    its last byte lands: raises :class:`_BadBlock` (ending the request) for a bad one,
    ``range_plan.Stopped`` once the fill stopped. ``piece``: the request starts with that
    piece of the block before ``first`` (``first_block.PiecedBlock`` checks that block)."""

    def __init__(
        self,
        state: _FillState,
        descriptor: int,
        first: int,
        last: int,
        stop: threading.Event,
        moved: Callable[[int], None],
        piece: Piece | None = None,
    ) -> None:
        self.state = state
        self.descriptor = descriptor
        self.last = last
        self.stop = stop
        self.moved = moved
        self.piece = piece
        self.index = first
        self.hasher = hashlib.sha256()
        if piece is None:
            self.restart_at(first)
        else:
            self.position = piece.start
            self.block_end = state.blocks.bounds(first)[1] if first < last else piece.end
        self.end = state.blocks.bounds(last - 1)[1] if last > first else piece.end

    @property
    def done(self) -> bool:
        return self.position >= self.end

    def restart_at(self, index: int) -> None:
        """The next bytes are block ``index``'s from its first byte."""
        self.position, self.block_end = self.state.blocks.bounds(index)
        self.hasher = hashlib.sha256()

    def restart(self) -> None:
        """Another version answered: from the piece's first byte while it is not all in,
        else from the first byte of the block the request was in."""
        if self.piece is not None and self.position < self.piece.end:
            self.position = self.piece.start
        else:
            self.restart_at(self.index)

    def __call__(self, data: bytes) -> None:
        if self.stop.is_set():
            raise Stopped
        view = memoryview(data)
        piece = self.piece
        if piece is not None and self.position < piece.end:
            taken = piece.write(view, self.position)
            self.position += taken
            self.state.count(taken)
            self.moved(taken)
            view = view[taken:]
        while view and self.index < self.last:
            piece = view[: self.block_end - self.position]
            pwrite_all(self.descriptor, piece, self.position)
            self.hasher.update(piece)
            self.position += len(piece)
            self.state.count(len(piece))
            self.moved(len(piece))
            view = view[len(piece) :]
            if self.position == self.block_end:
                self._block_done()

    def _block_done(self) -> None:
        blocks = self.state.blocks
        actual = self.hasher.hexdigest()
        if actual != blocks.blocks[self.index]:
            raise _BadBlock(self.index, actual)
        self.state.verified(self.index)
        self.index += 1
        self.hasher = hashlib.sha256()
        if self.index < self.last:
            self.block_end = blocks.bounds(self.index)[1]


def _fill_span(
    state: _FillState,
    descriptor: int,
    first: int,
    last: int,
    stop: threading.Event,
    moved: Callable[[int], None],
    piece: Piece | None = None,
) -> int | None:
    """Blocks ``[first, last)`` (after ``piece``, a piece of block ``first - 1``) written at
    their place and verified one by one; resumed from the byte reached after a fault
    (``target.resume``), from a bad block's first byte after a mismatch; one stream of the
    fill (the rate floor is the fill's). Returns the HTTP status of the last answer (206:
    the range honoured; None: the transport cannot say)."""
    target = state.target.in_fill(state.rate)
    sink = _SpanSink(state, descriptor, first, last, stop, moved, piece)
    end = sink.end

    def after_fault() -> None:
        if stop.is_set():  # a request that failed after another span did: no retry
            raise Stopped

    status = None
    while not sink.done:
        try:
            moved_on = resume(
                target,
                sink.position,
                end,
                sink,
                state.expected.version,
                after_fault=after_fault,
                passthrough=(_BadBlock, Stopped),
            )
            status = getattr(moved_on.facts, "status", None)
        except _BadBlock as bad:
            state.bad_block(bad.index, bad.actual)
            sink.restart_at(bad.index)
        except VersionMismatch as exc:
            state.changed(exc)
            sink.restart()
    return status
