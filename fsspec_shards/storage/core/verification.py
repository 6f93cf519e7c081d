"""The one verification rule: what a file's bytes must hash to before they are published.

Every fill path goes through it: one stream (``one_stream.py``), ranges in flight
(``ranges.py``), block fills (``blocks.py``), a resumed download (all of these resume
through ``transfer.resume`` and hash what lands, once, in order), streamed reads
(``files.py``) and a copy from the shared tier (``cache/shared.py``).

The rule:

- :func:`expected` gathers every checksum known for an object: the sums file's line (any
  algorithm: a ``md5:<hex>`` line too), the block manifest's whole-file SHA-256, and each
  one the backend's ``info()`` gives (MD5 ETag, ``md5Hash``, ``crc32c``...). None is
  skipped because another exists; equal ones are checked once.
- A :class:`WholeHasher` hashes the file with every expected algorithm on one pass over
  its bytes, in order; :meth:`Expectation.mismatch` compares what it computed with every
  expected checksum. A file is published (or its last byte handed out) only when all agree.
- A block manifest only checks bytes *earlier*: each block is checked as it lands, and the
  whole file is still hashed on the same pass and checked as above. A file whose blocks all
  match while its whole digest does not (the two manifests describe different bytes) is an
  ``IntegrityError`` naming both manifests, and nothing is published.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fsspec_shards.checksums import Checksum, StreamingHasher

BACKEND = "the backend's info()"
"""The source named for a checksum the backend gave."""


@dataclass(frozen=True)
class Known:
    """One expected checksum and where it came from (for messages: a manifest's name)."""

    checksum: Checksum
    source: str


@dataclass(frozen=True)
class Expectation:
    """Every checksum an object's bytes must have (empty: only its size is checked)."""

    known: tuple[Known, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.known)

    @property
    def algorithms(self) -> tuple[str, ...]:
        """Each algorithm to hash with, once."""
        return tuple(dict.fromkeys(k.checksum.algorithm for k in self.known))

    @property
    def checksums(self) -> tuple[Checksum, ...]:
        """Each distinct expected checksum."""
        return tuple(dict.fromkeys(k.checksum for k in self.known))

    def strongest(self) -> Checksum | None:
        """The strongest expected checksum (what an index entry records), or None."""
        return max(self.checksums, key=lambda c: c.strength, default=None)

    def sources_of(self, checksum: Checksum) -> str:
        """Where ``checksum`` was expected, every source named."""
        return " and ".join(dict.fromkeys(k.source for k in self.known if k.checksum == checksum))

    def mismatch(self, computed: Iterable[Checksum]) -> Mismatch | None:
        """The first expected checksum that ``computed`` (one per algorithm) does not match;
        None when every one matches."""
        by_algorithm = {checksum.algorithm: checksum for checksum in computed}
        for checksum in self.checksums:
            actual = by_algorithm.get(checksum.algorithm)
            if actual != checksum:
                return Mismatch(str(checksum), str(actual), self.sources_of(checksum))
        return None


@dataclass(frozen=True)
class Mismatch:
    """An expected checksum the bytes do not have: what was expected, what they hash to,
    and where the expected one came from."""

    expected: str
    actual: str
    source: str


def expected(
    manifest: Iterable[Known], backend: Iterable[Checksum], verify: str | bool
) -> Expectation:
    """What to verify under ``verify``: every manifest and backend checksum with ``"auto"``;
    nothing with ``"size"`` or ``False``."""
    if verify != "auto":
        return Expectation()
    known = [*manifest, *(Known(checksum, BACKEND) for checksum in backend)]
    return Expectation(tuple(dict.fromkeys(known)))


CONCURRENT_FROM = 64 * 1024
"""Pieces of at least this many bytes are hashed with every algorithm at once (one on the
calling thread, each other one on a helper thread of :func:`_helpers`); smaller pieces one
algorithm after the other (handing a piece over costs more than hashing it)."""


class WholeHasher:
    """A file hashed with several algorithms on one pass (each piece handed to each).

    With two or more algorithms a large piece is hashed by all of them at once (hashlib and
    google-crc32c release the GIL): an S3 object verified against a sums file's SHA-256 and
    its MD5 ETag costs the slower of the two, not their sum. :meth:`update` returns once
    every algorithm has the piece, so a caller may reuse its buffer."""

    def __init__(self, algorithms: Iterable[str]) -> None:
        self._hashers = [StreamingHasher(algorithm) for algorithm in dict.fromkeys(algorithms)]

    def update(self, data: bytes | memoryview) -> None:
        first, *others = self._hashers
        if not others or len(data) < CONCURRENT_FROM:
            for hasher in self._hashers:
                hasher.update(data)
            return
        helpers = _helpers()
        pieces = [helpers.submit(hasher.update, data) for hasher in others]
        first.update(data)
        for piece in pieces:
            piece.result()

    def checksums(self) -> list[Checksum]:
        """One checksum per algorithm, of everything handed over."""
        return [hasher.checksum() for hasher in self._hashers]


_HELPER_THREADS = 4
"""At most this many helper threads per process (pieces beyond wait their turn)."""
_helpers_of_process: tuple[int, ThreadPoolExecutor] | None = None


def _helpers() -> ThreadPoolExecutor:
    """This process's hashing threads (a forked child makes its own: the parent's threads
    are not in it, so its executor would wait for them forever). No lock: two threads racing
    here make two executors, and the one dropped holds no work for long; a lock held by another
    thread at a fork would never be released in the child."""
    global _helpers_of_process
    if _helpers_of_process is None or _helpers_of_process[0] != os.getpid():
        pool = ThreadPoolExecutor(_HELPER_THREADS, thread_name_prefix="fsspec-shards-hash")
        _helpers_of_process = (os.getpid(), pool)
    return _helpers_of_process[1]
