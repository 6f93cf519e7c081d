"""The whole-file check of a block fill (``blocks.py``): the whole file hashed on the same
pass, behind the blocks verified in order, and matched against every checksum known.

A block manifest only checks bytes earlier, never instead of the whole file
(``verification.py``). The object's size is the block manifest's
(:func:`check_listed_size`). A fill may start before the object's ``info()`` is in
(:class:`WholeFileCheck`): what the whole file must match is then known only once it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fsspec_shards.checksums import BlockList, Checksum
from fsspec_shards.errors import IntegrityError
from fsspec_shards.storage.transfer.one_stream import Frontier, OrderedHasher
from fsspec_shards.storage.transfer.target import Expected, Target


class WholeFileCheck:
    """The whole-file hash of a block fill, and what the whole file must match: every
    checksum known (``verification.py``: the manifests', the backend's).

    A fill that started before the object's ``info()`` was in (``fill_blocks``) works
    against a provisional version, the block manifest's size alone, whose first answer
    names the version (``versions.py``); when ``info()`` comes (on its own thread), its size
    must be the block manifest's, its version must agree with the answers' (else the
    object changed: ``_FillState.changed``), and only then is what the whole file must
    match known and its hash started: it reads the file back behind ``in_order``, so
    starting late loses nothing. The fill never ends verified before that.
    """

    def __init__(
        self,
        target: Target,
        blocks: BlockList,
        descriptor: int,
        in_order: Frontier,
        info_in: Callable[[dict[str, Any]], Expected],
    ) -> None:
        self.target = target
        self.blocks = blocks
        self.descriptor = descriptor
        self.in_order = in_order
        self.info_in = info_in
        """What the fill makes of ``info()`` once in: the version check, what it expects."""
        self.expected: Expected | None = None
        """What the whole file must match (None: ``info()`` is not in yet)."""
        self._hasher: OrderedHasher | None = None
        self._in = threading.Event()
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self._abandoned = False

    def start(self, expected: Expected) -> None:
        """Hash the file as its blocks verify, for ``expected``'s checksums."""
        with self._lock:
            if not self._abandoned:
                self.expected = expected
                self._hasher = OrderedHasher(expected.checksums.algorithms)
                self._hasher.update_from_file(self.descriptor, 0, self.blocks.size, self.in_order)
            self._in.set()

    def follow(
        self, pending: Future[dict[str, Any]], stop: Callable[[BaseException], None]
    ) -> None:
        """Take ``pending``'s ``info()`` when it comes (on the thread it comes on); a
        failure of it, or a size other than the block manifest's, is passed to ``stop``."""

        def came(done: Future[dict[str, Any]]) -> None:
            try:
                info = done.result()
                if self._abandoned:
                    return
                check_listed_size(self.target, self.blocks, info.get("size"))
                self.start(self.info_in(info))
            except BaseException as exc:
                self._failure = exc
                stop(exc)
            finally:
                self._in.set()

        pending.add_done_callback(came)

    def computed(self) -> list[Checksum]:
        """The whole file's checksums (once ``info()`` is in: raises its failure)."""
        self._in.wait()
        if self._failure is not None:
            raise self._failure
        return self._hasher.checksums()

    def abandon(self) -> None:
        """The fill failed: no hash, nothing more taken from ``info()``."""
        with self._lock:
            self._abandoned = True
            if self._hasher is not None:
                self._hasher.abandon()


def check_listed_size(target: Target, blocks: BlockList, size: int | None) -> None:
    """``IntegrityError`` unless the object's ``size`` is the one its block manifest lists."""
    if size != blocks.size:
        target.incr("integrity_failures")
        raise IntegrityError(
            target.shown,
            f"{blocks.size} bytes (block manifest)",
            f"{size} bytes",
            "the object is not the one the block manifest lists",
        )
