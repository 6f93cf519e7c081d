"""``Fetcher``: what the reads of one ``wds`` filesystem go through, in one process.

Built from the parsed options when the filesystem is made, and again in a forked child on
first use (:meth:`Fetcher.in_this_process`: the parent's locks, event loop, obstore stores
and index connections are not the child's). It owns the backend instance, the download
transport (chosen when it is built), the cache and its shared tier, the checksum manifest
and the objects' identities, and orchestrates reads: the cached copy, a fill on a miss
(whole, or block by block; through the shared tier when there is one), streamed reads with
the cache off, and byte ranges straight from the backend.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, BinaryIO

import fsspec
from fsspec.utils import tokenize

from fsspec_shards.counters import COUNTERS, SHARED_COUNTERS
from fsspec_shards.redact import install_log_redaction
from fsspec_shards.storage.backends import ObjectId, backend_for, object_id
from fsspec_shards.storage.backends.base import call, protocol_of
from fsspec_shards.storage.byte_ranges import Range, read_backend_ranges, read_local_range
from fsspec_shards.storage.core.integrity import Manifest, load_manifest
from fsspec_shards.storage.core.retry import RetryPolicy
from fsspec_shards.storage.files import BlockCheckedFile, CachedFile, RetryingFile
from fsspec_shards.storage.transfer import planner
from fsspec_shards.storage.transfer.obstore_transport import (
    DownloadTransport,
    download_transport,
)
from fsspec_shards.storage.transfer.one_stream import read_whole
from fsspec_shards.storage.transfer.streams import Transport, transport_for
from fsspec_shards.storage.transfer.target import Target

if TYPE_CHECKING:
    from fsspec_shards.checksums import BlockList
    from fsspec_shards.storage.cache import ShardCache
    from fsspec_shards.storage.cache.shared import SharedTier
    from fsspec_shards.storage.core.options import StorageOptions

logger = logging.getLogger("fsspec_shards.storage.fetcher")

_WRITE_RACE_ATTEMPTS = 3
_REMEMBERED_OBJECTS = 65536
_SHARED_BACKENDS: dict[str, fsspec.AbstractFileSystem] = {}
_SHARED_BACKENDS_LOCK = threading.Lock()
# Counters with the cache off, per cache directory and process: fsspec makes one instance per
# thread, and reads made through any of them count (with the cache on they live in the cache).
_MEMORY_COUNTERS: dict[str, dict[str, int]] = {}
_MEMORY_COUNTERS_LOCK = threading.Lock()
_SUCCESSOR_LOCK = threading.Lock()


def _forget_parent_state() -> None:
    """In a forked child: the parent's backends use its event loop; its locks may be held."""
    global _SHARED_BACKENDS_LOCK, _MEMORY_COUNTERS_LOCK, _SUCCESSOR_LOCK
    _SHARED_BACKENDS.clear()
    _SHARED_BACKENDS_LOCK = threading.Lock()
    _MEMORY_COUNTERS_LOCK = threading.Lock()
    _SUCCESSOR_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_state)


class Fetcher:
    """One filesystem's reads in one process. ``options``: the parsed options; ``owner``: the
    filesystem the files opened here report (they pickle through it); ``fs``: the user's
    backend, else one is built from ``target_protocol`` and ``target_options``."""

    def __init__(
        self,
        options: StorageOptions,
        owner: fsspec.AbstractFileSystem,
        target_protocol: str | None,
        target_options: dict | None,
        fs: fsspec.AbstractFileSystem | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.pid = os.getpid()
        self.options = options
        self.owner = owner
        self._target_protocol = target_protocol
        self._target_options = dict(target_options or {})
        self._given_fs = fs
        self._successor: Fetcher | None = None
        policy = policy or options.retry_policy
        self.fs = fs if fs is not None else _backend(target_protocol, self._target_options, policy)
        shorter = backend_for(protocol_of(self.fs)).timeout(self.fs)
        if shorter is not None and shorter < policy.timeout:
            policy = dataclasses.replace(policy, timeout=shorter)
        self.policy = policy
        self.transport = self._download_transport()
        if not isinstance(self.transport, DownloadTransport):
            self.fs = self.built_fs  # fsspec's transport reads it: built now, before a fork
        self._lock = threading.RLock()
        self._cache: ShardCache | None = None
        self._shared: SharedTier | None = None
        self._manifest: Manifest | None = None
        if isinstance(options.checksums, dict):  # checked now: a bad entry is a bad option
            self._manifest = load_manifest(options.checksums, self.fs)
        self._objects: dict[str, ObjectId] = {}
        self._prefetched: set[str] = set()
        """Keys a prefetch brought in: their next read counts no hit (the prefetch counted it)."""
        with _MEMORY_COUNTERS_LOCK:
            self._memory_counters = _MEMORY_COUNTERS.setdefault(
                options.cache_dir, dict.fromkeys(COUNTERS, 0)
            )

    @property
    def built_fs(self) -> fsspec.AbstractFileSystem:
        """The backend itself: :attr:`fs`, built now where that is its stand-in."""
        unbuilt = backend_for(protocol_of(self.fs)).unbuilt
        if unbuilt is not None and isinstance(self.fs, unbuilt):
            return self.fs.built()
        return self.fs

    def in_this_process(self) -> Fetcher:
        """This fetcher, or in a forked child the child's own (built once)."""
        if self.pid == os.getpid():
            return self
        with _SUCCESSOR_LOCK:
            successor = self._successor
            if successor is None or successor.pid != os.getpid():
                given = self._given_fs
                given = None if given is None else _rebuilt_after_fork(given)
                protocol, options = self._target_protocol, self._target_options
                successor = Fetcher(self.options, self.owner, protocol, options, given, self.policy)
                if self._manifest is not None:  # loaded here already: not read again
                    successor._manifest = self._manifest
                self._successor = successor
        return successor

    def _download_transport(self) -> Transport:
        """What downloads go through (``transport="obstore"`` raises a bad option now)."""
        fs = self.fs
        if self._given_fs is not None:
            protocol, options = protocol_of(fs), fs.storage_options
        else:
            protocol, options = self._target_protocol, self._target_options
        if isinstance(protocol, tuple | list):
            protocol = protocol[0]
        return download_transport(
            protocol, options, self.options.transport, fallback=transport_for(fs)
        )

    # -- the cache, the shared tier and the manifest (built on first use) ----------------

    @property
    def cache(self) -> ShardCache | None:
        """The :class:`ShardCache` (None with ``cache=False``)."""
        if not self.options.cache:
            return None
        with self._lock:
            if self._cache is None:
                from fsspec_shards.storage.cache import ShardCache

                self._cache = ShardCache(self.options.cache_dir, self.options.cache_size)
            return self._cache

    @property
    def shared(self) -> SharedTier | None:
        """The :class:`SharedTier` (None without ``shared_cache_dir`` or with the cache off)."""
        options = self.options
        if not options.cache or options.shared_cache_dir is None:
            return None
        with self._lock:
            if self._shared is None:
                from fsspec_shards.storage.cache.shared import SharedTier

                self._shared = SharedTier(
                    options.shared_cache_dir, options.shared_cache_size, count=self.incr
                )
            return self._shared

    @property
    def manifest(self) -> Manifest | None:
        """The ``checksums`` option, loaded on first use."""
        source = self.options.checksums
        if source is None:
            return None
        with self._lock:
            if self._manifest is None:
                self._manifest = self.policy.call(
                    lambda: load_manifest(source, self.fs, self._read_whole),
                    source if isinstance(source, str) else "checksums",
                    "load manifest",
                    lambda: self.incr("retries"),
                )
            return self._manifest

    def _read_whole(self, backend_path: str) -> bytes:
        return read_whole(self.transport, self.fs, backend_path, self.policy.timeout)

    # -- objects, counters, backend calls -------------------------------------------------

    def object(self, backend_path: str) -> ObjectId:
        """Which object ``backend_path`` names (cache key, display text); remembered, so that
        a cache hit does not pay for hashing the URL again (the backend never changes)."""
        found = self._objects.get(backend_path)
        if found is None:
            found = object_id(self.fs, backend_path)
            if len(self._objects) >= _REMEMBERED_OBJECTS:
                self._objects.clear()
            self._objects[backend_path] = found
        return found

    def incr(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to counter ``name`` (in the cache, or this process's with it off)."""
        if not amount:
            return
        cache = self.cache
        if cache is not None:
            cache.incr(name, amount)
        else:
            with _MEMORY_COUNTERS_LOCK:
                self._memory_counters[name] = self._memory_counters.get(name, 0) + amount

    def retried(self, method: str, backend_path: Any, *args: Any, **kwargs: Any) -> Any:
        """``backend.<method>(backend_path, ...)`` with retries, on fresh listings."""
        single = isinstance(backend_path, str)
        self.fs.invalidate_cache(backend_path if single else None)
        return self.policy.call(
            lambda: call(
                self.fs, method, backend_path, *args, timeout=self.policy.timeout, **kwargs
            ),
            self.object(backend_path).shown if single else method,
            method,
            lambda: self.incr("retries"),
            hide=tuple(backend_path) if isinstance(backend_path, list) else (backend_path,),
        )

    def target(self, backend_path: str, with_manifest: bool = True) -> Target:
        """What a download of ``backend_path`` needs: backend, identity, policy, checks."""
        manifest = self.manifest if with_manifest else None
        options = self.options
        return Target(
            fs=self.fs,
            path=backend_path,
            obj=self.object(backend_path),
            policy=self.policy,
            verify=options.verify,
            manifest=tuple(manifest.known(backend_path)) if manifest is not None else (),
            count=self.incr,
            transport=self.transport,
            ranges_in_flight=options.ranges_in_flight,
            plan_dir=options.cache_dir if options.cache else None,
            min_rate=options.min_rate,
            rate_window=options.min_rate_window,
        )

    def blocks_of(self, backend_path: str) -> BlockList | None:
        """The block manifest's entry of ``backend_path`` (None without, or verify != auto)."""
        manifest = self.manifest
        if manifest is None or self.options.verify != "auto":
            return None
        return manifest.lookup_blocks(backend_path)

    # -- the cache ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters (hits, misses, bytes_downloaded, retries, integrity_failures, evictions)
        and the cache's content (cached_files, cached_bytes)."""
        cache = self.cache
        if cache is not None:
            stats = cache.stats()
            if self.options.shared_cache_dir is not None:
                for name in SHARED_COUNTERS:
                    stats.setdefault(name, 0)
                stats["shared_cache_dir"] = self.options.shared_cache_dir
            return stats
        with _MEMORY_COUNTERS_LOCK:
            stats = dict(self._memory_counters)
        stats.update(cached_files=0, cached_bytes=0)
        return stats

    def clear(self) -> None:
        """Remove every cached file (and, with the cache off, reset the counters)."""
        cache = self.cache
        if cache is not None:
            cache.clear()
        else:
            with _MEMORY_COUNTERS_LOCK:
                self._memory_counters.update(dict.fromkeys(COUNTERS, 0))

    def drop_cached(self, backend_paths: str | list[str]) -> None:
        """Drop the cached copies of ``backend_paths``, stop downloads of them in flight (any
        process) from publishing, and start a new write generation in the shared tier."""
        paths = backend_paths if isinstance(backend_paths, list) else [backend_paths]
        options = self.options
        if options.cache and options.shared_cache_dir is not None:
            for path in paths:
                self.shared.new_generation(self.object(path))
        if not options.cache or not os.path.isdir(options.cache_dir):
            return  # no cache directory: nothing was ever cached there
        cache = self.cache
        for path in paths:
            cache.discard(self.object(path))

    def prefetch(self, backend_path: str) -> str | None:
        """Make sure ``backend_path`` is in the cache; its local path (None when it is not
        cached: the cache is off, read-only or too small, or it was written meanwhile)."""
        if not self.options.cache:
            return None
        obj = self.object(backend_path)
        if not self.options.check_stale:
            local = self.cache.get(obj, count=False)
            if local is not None:
                return local
        handle = self._open_cached(backend_path, obj)
        if handle is None:
            return None
        self._prefetched.add(obj.key)
        with handle:
            wait = getattr(handle.raw, "wait_until_cached", None)
            if wait is not None:  # still filling (with a block manifest): let it finish
                wait()
        return self.cache.get(obj, count=False)

    def _cached_handle(self, backend_path: str, obj: ObjectId | None = None) -> CachedFile | None:
        """The cached copy opened for reading, or None; drops it first if it went stale."""
        cache = self.cache
        obj = obj or self.object(backend_path)
        if self.options.check_stale and not self._still_fresh(cache, obj, backend_path):
            cache.discard(obj)
            return None
        prefetched = self._prefetched
        raw = cache.open(obj, count=obj.key not in prefetched)
        prefetched.discard(obj.key)
        return None if raw is None else CachedFile(raw, self.owner, backend_path)

    def _still_fresh(self, cache: ShardCache, obj: ObjectId, backend_path: str) -> bool:
        metadata = cache.metadata(obj)
        if metadata is None:
            return True
        validated = metadata.get("validated_at") or 0
        ttl = self.options.stale_ttl
        if ttl is not None and time.time() - validated < ttl:
            return True
        info = self.retried("info", backend_path)
        current = backend_for(protocol_of(self.fs)).identity(info)
        if current != metadata.get("identity"):
            logger.info("cached copy of %s is stale: downloading again", obj.shown)
            return False
        cache.touch_validated(obj)
        return True

    def _open_cached(self, backend_path: str, obj: ObjectId | None = None) -> CachedFile | None:
        """The whole verified file from the cache, downloading it on a miss; None when it
        cannot be cached (larger than the cache, no room, a read-only cache).

        The write generation is read before the backend is asked for the file's size and
        identity, so a write through ``wds`` in between makes the cache refuse the download
        rather than publish the old version: the backend is asked again, and after three
        such races the file is streamed uncached. A file whose block manifest entry is known
        already fills at once, its ``info()`` beside (:meth:`_open_filling_beside`).
        """
        from fsspec_shards.storage.cache import (
            CacheFullError,
            ReadOnlyCacheError,
            WrittenWhileReadingError,
        )

        obj = obj or self.object(backend_path)
        handle = self._cached_handle(backend_path, obj)
        if handle is not None:
            return handle
        for _ in range(_WRITE_RACE_ATTEMPTS):
            since = self.cache.generation(obj)
            try:
                raw = self._open_filled(backend_path, obj, since)
            except CacheFullError as exc:
                warnings.warn(f"not caching {obj.shown}: {exc}; streaming it instead", stacklevel=4)
                return None
            except ReadOnlyCacheError:
                return None
            except WrittenWhileReadingError:
                continue
            return CachedFile(raw, self.owner, backend_path)
        return None

    def _open_filled(self, backend_path: str, obj: ObjectId, since: int) -> io.RawIOBase:
        """The object from the cache after a miss (write generation ``since``): filled
        whole, or block by block (followed as it fills), or beside its ``info()`` where
        the block manifest is known already."""
        known = self._blocks_known_now(backend_path)
        if known is not None:
            return self._open_filling_beside(backend_path, obj, known, since)
        loaded = self._manifest is not None or self.options.checksums is None
        target, info = self.target(backend_path, loaded).stat_beside(
            None if loaded else lambda: self.target(backend_path).manifest
        )
        blocks = self.blocks_of(backend_path)
        if blocks is not None:
            return self._open_filling(backend_path, obj, target, info, blocks, since)
        fill = self._filler(obj, target, info)
        return self.cache.fetch(obj, fill, expected_size=info.get("size"), since=since)

    def _blocks_known_now(self, backend_path: str) -> BlockList | None:
        """The block manifest entry of ``backend_path`` when it is known without asking the
        backend (the manifest is loaded in this process) and a fill may start before the
        object's ``info()`` is in (no shared tier, which keys copies by that identity)."""
        if self._manifest is None or self.shared is not None:
            return None
        return self.blocks_of(backend_path)

    def _open_filling_beside(
        self, backend_path: str, obj: ObjectId, blocks: BlockList, since: int
    ) -> io.RawIOBase:
        """:meth:`_open_filling` started before the object's ``info()`` is in: the block
        manifest gives its size, so the fill's first GETs go out at once and the HEAD runs
        beside them (``blocks.fill_blocks``: one round trip for a cold file, not two).
        Returns once the HEAD is in; raises what it raised (a missing, forbidden or
        directory object), ahead of the fill's own failure, once the fill it stopped is
        gone (nothing cached, no temp file, the key's lock free)."""
        from fsspec_shards.storage.cache.following import close_settled

        target = self.target(backend_path)
        info = target.stat_on_a_thread()
        opened: Exception | None = None
        try:
            raw = self._open_filling(backend_path, obj, target, info, blocks, since)
        except Exception as exc:  # (cache full, written meanwhile, ...): after the HEAD's
            opened = exc
        failure = info.exception()
        if failure is not None:
            if opened is None:
                close_settled(raw)  # (the fill stops at its next byte)
            raise failure
        if opened is not None:
            raise opened
        return raw

    def _open_filling(
        self,
        backend_path: str,
        obj: ObjectId,
        target: Target,
        info: dict | Future[dict],
        blocks: BlockList,
        since: int,
    ) -> io.RawIOBase:
        """The object from the cache, readable block by block while it fills
        (:mod:`.cache.following`); ``info`` may be still to come (no shared tier then)."""
        from fsspec_shards.storage.cache.following import open_while_filling
        from fsspec_shards.storage.transfer.block_progress import BlockProgress

        def fill(out: BinaryIO, progress: BlockProgress) -> dict:
            download_blocks = lambda into: planner.fill(  # noqa: E731
                target, into, info, blocks=blocks, progress=progress
            )
            if isinstance(info, Future):
                return download_blocks(out)
            return self._filler(obj, target, info, download_blocks)(out)

        return open_while_filling(
            self.cache, obj, blocks, fill, since, lambda: self._reopen_raw(backend_path)
        )

    def _reopen_raw(self, backend_path: str) -> io.RawIOBase:
        """The object open again from the cache, raw (a reader whose fill ended goes on)."""
        handle = self._open_cached(backend_path)
        if handle is None:
            raise OSError(f"{self.object(backend_path).shown} can no longer be cached")
        return handle.detach()

    def _filler(
        self,
        obj: ObjectId,
        target: Target,
        info: dict,
        fetch: Callable[[BinaryIO], dict] | None = None,
    ) -> Callable[[BinaryIO], dict]:
        """What fills a local miss: the shared tier when there is one (which downloads from
        the backend, and keeps a copy, only when it lacks this version), else the backend."""
        shared = self.shared
        if fetch is None:
            fetch = lambda out: planner.fill(target, out, info)  # noqa: E731
        if shared is None:
            return fetch

        def fill(out: BinaryIO) -> dict:
            expected = target.expect(info)
            metadata, source = shared.fill(
                shared.current_version(obj, expected.identity),
                out,
                fetch,
                size=info.get("size"),
                expected=expected.checksums,
                identity=expected.identity,
            )
            self.incr("shared_hits" if source == "shared" else "shared_misses")
            return metadata

        return fill

    # -- reading -----------------------------------------------------------------------

    def open(self, backend_path: str, block_size: int | None = None) -> BinaryIO:
        """``backend_path`` open for reading: the cached copy (filled on a miss), else a
        file streaming it from the backend, verified as it is read."""
        if self.options.cache:
            handle = self._open_cached(backend_path)
            if handle is not None:
                return handle
        target = self.target(backend_path)
        info = target.stat()
        if info.get("size") is None:  # no ranged reads without a size: spool it whole
            with tempfile.TemporaryFile() as spool:
                planner.fill(target, spool, info)
                spool.flush()
                raw = io.FileIO(os.dup(spool.fileno()), "rb")
            raw.seek(0)
            return CachedFile(raw, self.owner, backend_path)
        block_size = block_size or self.options.block_size
        blocks = self.blocks_of(backend_path)
        if blocks is not None:
            return BlockCheckedFile(self.owner, target, info, block_size, blocks)
        return RetryingFile(self.owner, target, info, block_size)

    def cat(self, backend_path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes of ``backend_path`` (``[start, end)``, negative from the end), from the
        cached copy; a miss fills the cache with the whole verified file (with
        ``ranged_reads="direct"`` a ranged miss reads just the range)."""
        if start not in (None, 0) or end is not None:
            return self.read_ranges(backend_path, [(start, end)])[0]
        handle = self._local_copy(backend_path, fill=True)
        if handle is not None:
            with handle:
                return read_local_range(handle, None, None)
        target = self.target(backend_path)
        buffer = io.BytesIO()
        planner.fill(target, buffer, target.stat())
        return buffer.getvalue()

    def read_ranges(self, backend_path: str, ranges: list[Range]) -> list[bytes]:
        """Byte ranges of ``backend_path``, all of one version, stat-ed and opened once: from
        the cached copy (with ``ranged_reads="cache"`` filled on a miss), else the backend."""
        handle = self._local_copy(backend_path, fill=self.options.ranged_reads == "cache")
        if handle is not None:
            with handle:
                return [read_local_range(handle, *bounds) for bounds in ranges]
        target = self.target(backend_path)
        return read_backend_ranges(target, ranges, target.stat())

    def _local_copy(self, backend_path: str, fill: bool) -> BinaryIO | None:
        """The cached copy opened for reading (with ``fill``, downloaded on a miss), or None."""
        if not self.options.cache:
            return None
        return self._open_cached(backend_path) if fill else self._cached_handle(backend_path)


def _backend(
    protocol: str | None, target_options: dict, policy: RetryPolicy
) -> fsspec.AbstractFileSystem:
    """The tamed backend (own retries down, listing cache off), one per process and options:
    fsspec makes a wds instance per thread, and a client each would cost (S3: about 1 s).
    Where the backend has a stand-in (``Backend.unbuilt``), the stand-in: it is built on
    first use, which a read through obstore may never make."""
    backend_class = backend_for(protocol)
    options = backend_class.tamed_options(target_options, policy.timeout)
    key = tokenize(protocol, options)  # per process: emptied in a forked child

    def build() -> fsspec.AbstractFileSystem:
        built = fsspec.filesystem(protocol, **options)
        backend_class.tame_instance(built)
        install_log_redaction()  # the loggers of a backend imported only now
        return built

    with _SHARED_BACKENDS_LOCK:
        backend = _SHARED_BACKENDS.get(key)
        if backend is None:
            unbuilt = backend_class.unbuilt
            backend = build() if unbuilt is None else unbuilt(options, build)
            _SHARED_BACKENDS[key] = backend
    return backend


def _rebuilt_after_fork(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """The user's backend for a forked child: an async one, bound to the parent's event loop
    (fsspec refuses it after a fork), is built again from its arguments."""
    if not getattr(fs, "async_impl", False):
        return fs
    return type(fs)(*fs.storage_args, **fs.storage_options)
