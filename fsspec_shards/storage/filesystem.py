"""``WdsFileSystem``: the ``wds`` fsspec protocol, a retrying, verifying, caching wrapper.

``wds::s3://bucket/train-0001.tar`` reads the object through any fsspec backend; whole files
are downloaded once into a shared local cache (:class:`~fsspec_shards.storage.cache.ShardCache`)
with retries, resume and verification, then read from local disk. Listing calls go to the
backend with retries; writes go straight to the backend and drop the cached copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

import fsspec
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.utils import other_paths, stringify_path, tokenize

from fsspec_shards import option_shapes
from fsspec_shards.counters import COUNTERS, SHARED_COUNTERS
from fsspec_shards.redact import clean_error, install_log_redaction, raising_clean, redact_url
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.accepted_options import check_backend_options
from fsspec_shards.storage.backends.base import call
from fsspec_shards.storage.backends.fields import protocol_of
from fsspec_shards.storage.backends.identity import ObjectId, object_id
from fsspec_shards.storage.backends.mapping import FSSPEC_INSTANCE_OPTIONS
from fsspec_shards.storage.backends.versions import Unproven, Version, VersionMismatch
from fsspec_shards.storage.core.integrity import Manifest, load_manifest
from fsspec_shards.storage.core.options import StorageOptions
from fsspec_shards.storage.core.retry import TransientError
from fsspec_shards.storage.deps import fsspec as fsspec_deps
from fsspec_shards.storage.files import (
    BlockCheckedFile,
    CachedFile,
    DropCachedOnClose,
    RetryingFile,
)
from fsspec_shards.storage.transfer import planner
from fsspec_shards.storage.transfer.obstore_transport import (
    DownloadTransport,
    HttpStatusError,
    download_transport,
)
from fsspec_shards.storage.transfer.one_stream import read_range
from fsspec_shards.storage.transfer.streams import Transport, transport_for
from fsspec_shards.storage.transfer.target import Target

if TYPE_CHECKING:
    from fsspec_shards.checksums import BlockList
    from fsspec_shards.storage.cache import ShardCache
    from fsspec_shards.storage.cache.shared import SharedTier

logger = logging.getLogger("fsspec_shards.storage.filesystem")

_WRITE_RACE_ATTEMPTS = 3
_REMEMBERED_OBJECTS = 65536
_SHARED_BACKENDS: dict[str, fsspec.AbstractFileSystem] = {}
_SHARED_BACKENDS_LOCK = threading.Lock()
# Counters with the cache off, per cache directory and process: fsspec makes one instance per
# thread, and reads made through any of them count (with the cache on they live in the cache).
_MEMORY_COUNTERS: dict[str, dict[str, int]] = {}
_MEMORY_COUNTERS_LOCK = threading.Lock()
_PROCESS_STATE_LOCK = threading.Lock()


def _forget_shared_backends() -> None:
    """In a forked child: the parent's backends are bound to its event loop, and the locks
    may have been held by a thread that does not exist here."""
    global _SHARED_BACKENDS_LOCK, _MEMORY_COUNTERS_LOCK, _PROCESS_STATE_LOCK
    _SHARED_BACKENDS.clear()
    _SHARED_BACKENDS_LOCK = threading.Lock()
    _MEMORY_COUNTERS_LOCK = threading.Lock()
    _PROCESS_STATE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_backends)


@dataclasses.dataclass
class _ProcessState:
    """What one filesystem instance holds for one process. A forked child starts a new one:
    a lock held by a parent thread at the fork is never released in the child, and the
    parent's event loop, obstore stores and index connections are not the child's."""

    pid: int
    given_fs: fsspec.AbstractFileSystem | None
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    backend: fsspec.AbstractFileSystem | None = None
    transport: Transport | None = None
    cache: ShardCache | None = None
    shared: SharedTier | None = None
    prefetched: set[str] = dataclasses.field(default_factory=set)
    """Keys a prefetch brought in: their next read counts no hit (the prefetch counted it)."""


class WdsFileSystem(ChainedFileSystem):
    """Retrying, verifying, caching access to any fsspec backend.

    Parameters
    ----------
    target_protocol, target_options, fs:
        The backend, as fsspec's caching filesystems take them (``fs`` wins when given).
    **options:
        The ``wds`` options (``cache_dir``, ``cache_size``, ``retries``, ``verify``, ...):
        their defaults, parsers and meanings are the table in
        :mod:`fsspec_shards.storage.core.options`, parsed into ``self.options``
        (:class:`~fsspec_shards.storage.core.options.StorageOptions`); see
        docs/configuration.md.

    Every option may also come from ``fsspec.config.conf["wds"]`` (``FSSPEC_WDS_<OPTION>``).
    """

    protocol = option_shapes.LAYER
    _strip_tokenize_options = ("fo",)
    # Exceptions leave every public method (and _open) through clean_error: see the end of
    # this module, where they are wrapped.

    def __init__(
        self,
        target_protocol: str | None = None,
        target_options: dict | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        **options: Any,
    ) -> None:
        if target_options is not None and not isinstance(target_options, dict):
            raise ValueError(
                f"invalid value for option 'target_options': expected a dict, "
                f"got {type(target_options).__name__}"
            )
        # the shapes other tools hand options in (sections, datasets' doubled hop): see
        # option_shapes; neither a chain's keys nor another protocol's section reach the backend
        own, backend = option_shapes.layer_options(target_protocol, target_options, options)
        self._configure(target_protocol, backend, fs, **own)

    def _configure(
        self,
        target_protocol: str | None = None,
        target_options: dict | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        fo: str | None = None,
        **options: Any,
    ) -> None:
        """The options once ``__init__`` sorted out the layer's own from the backend's:
        fsspec's instance options go to fsspec, the rest are parsed (``StorageOptions``)."""
        instance = {k: options.pop(k) for k in set(options) & FSSPEC_INSTANCE_OPTIONS}
        self.options = StorageOptions.parse(**options)
        super().__init__(**instance)
        install_log_redaction()
        if fs is None and not target_protocol:
            raise ValueError(
                "the wds filesystem needs a backend: a chained URL like 'wds::s3://bucket/key', "
                "target_protocol=..., or fs=..."
            )
        # the options' retry policy, its timeout shortened below to the backend's if shorter
        self.policy = self.options.retry_policy
        self._target_protocol = target_protocol
        self._target_options = dict(target_options or {})
        self._state = _ProcessState(os.getpid(), given_fs=fs)
        self._objects: dict[str, ObjectId] = {}
        self._manifest: Manifest | None = None
        with _MEMORY_COUNTERS_LOCK:
            self._memory_counters = _MEMORY_COUNTERS.setdefault(
                self.options.cache_dir, dict.fromkeys(COUNTERS, 0)
            )
        if fs is None:
            check_backend_options(target_protocol, self._target_options)
            self._build_backend()
        shorter = backend_for(protocol_of(self.fs)).timeout(self.fs)
        if shorter is not None and shorter < self.policy.timeout:
            self.policy = dataclasses.replace(self.policy, timeout=shorter)
        if isinstance(self.options.checksums, dict):  # checked now: a bad entry is a bad option
            self._manifest = load_manifest(self.options.checksums, self.fs)
        if self.options.transport == "obstore":  # what obstore cannot carry over is a bad option
            self.download_transport  # noqa: B018 - chosen now for the error

    # -- the backend, the cache and the manifest (per process) ----------------------------

    @property
    def _process(self) -> _ProcessState:
        """This process's state; the first call in a forked child starts the child's own,
        with a user-given async backend rebuilt (fsspec refuses the parent's loop)."""
        state = self._state
        if state.pid != os.getpid():
            with _PROCESS_STATE_LOCK:
                state = self._state
                if state.pid != os.getpid():
                    given = state.given_fs
                    rebuilt = None if given is None else _rebuilt_after_fork(given)
                    state = _ProcessState(os.getpid(), given_fs=rebuilt)
                    self._state = state
        return state

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The backend: the one given, or the tamed one built for this process."""
        state = self._process
        if state.given_fs is not None:
            return state.given_fs
        if state.backend is None:
            self._build_backend()
        return state.backend

    def _build_backend(self) -> None:
        """Build (or reuse) the tamed backend: its own retries down, its listing cache off
        (``info()`` before a download is always fresh). fsspec caches a sync filesystem per
        thread, so each thread gets its own wds instance; they share one backend per
        process, so that threads do not each pay for a client (an S3 client takes about a
        second)."""
        protocol = self._target_protocol
        options = backend_for(protocol).tamed_options(self._target_options, self.policy.timeout)
        key = tokenize(protocol, options)  # per process: emptied in a forked child
        with _SHARED_BACKENDS_LOCK:
            backend = _SHARED_BACKENDS.get(key)
            if backend is None:
                backend = fsspec.filesystem(protocol, **options)
                backend_for(protocol).tame_instance(backend)
                _SHARED_BACKENDS[key] = backend
        self._process.backend = backend

    @property
    def download_transport(self) -> Transport:
        """What downloads go through (the ``transport`` option), chosen once per process:
        a forked child chooses again (obstore does not survive ``fork()`` once used)."""
        state = self._process
        if state.transport is not None:
            return state.transport
        with state.lock:
            if state.transport is None:
                fs = self.fs
                if state.given_fs is not None:
                    protocol, options = protocol_of(fs), fs.storage_options
                else:
                    protocol, options = self._target_protocol, self._target_options
                if isinstance(protocol, tuple | list):
                    protocol = protocol[0]
                state.transport = download_transport(
                    protocol, options, self.options.transport, fallback=transport_for(fs)
                )
            return state.transport

    @property
    def shard_cache(self) -> ShardCache | None:
        """The :class:`ShardCache` behind this filesystem (None with ``cache=False``)."""
        if not self.options.cache:
            return None
        state = self._process
        with state.lock:
            if state.cache is None:
                from fsspec_shards.storage.cache import ShardCache

                state.cache = ShardCache(self.options.cache_dir, self.options.cache_size)
            return state.cache

    @property
    def shared_tier(self) -> SharedTier | None:
        """The :class:`SharedTier` (None without ``shared_cache_dir`` or with the cache off)."""
        if not self.options.cache or self.options.shared_cache_dir is None:
            return None
        state = self._process
        with state.lock:
            if state.shared is None:
                from fsspec_shards.storage.cache.shared import SharedTier

                state.shared = SharedTier(
                    self.options.shared_cache_dir, self.options.shared_cache_size, count=self._count
                )
            return state.shared

    @property
    def manifest(self) -> Manifest | None:
        """The ``checksums`` option, loaded on first use."""
        if self.options.checksums is None:
            return None
        with self._process.lock:
            if self._manifest is None:
                source = self.options.checksums
                self._manifest = self.policy.call(
                    lambda: load_manifest(source, self.fs, self._read_whole),
                    source if isinstance(source, str) else "checksums",
                    "load manifest",
                    lambda: self._count("retries"),
                )
            return self._manifest

    def _read_whole(self, backend_path: str) -> bytes:
        """A whole small object (a checksum manifest) through the transport downloads use:
        where that is obstore, a DataLoader worker reads its manifests without starting the
        fsspec backend's session (botocore's, for s3: most of a worker's first batch)."""
        transport = self.download_transport
        if not isinstance(transport, DownloadTransport):
            return self.fs.cat_file(backend_path)
        pieces: list[bytes] = []
        try:
            facts = transport.stream(
                backend_path,
                0,
                None,
                lambda piece: pieces.append(bytes(piece)),
                self.policy.timeout,
            )
        except HttpStatusError as exc:
            if exc.status != 416:
                raise
            # an empty object has no byte 0 to ask a range from: the backend reads it whole
            return self.fs.cat_file(backend_path)
        data = b"".join(pieces)
        if facts.total is not None and len(data) != facts.total:
            raise TransientError(
                f"{redact_url(backend_path)}: read {len(data)} of {facts.total} bytes"
            )
        return data

    # -- paths, counters ---------------------------------------------------------------

    def _backend_path(self, path: Any) -> Any:
        if isinstance(path, list | tuple):
            return [self._backend_path(p) for p in path]
        path = stringify_path(path)
        for prefix in ("wds::", "wds://"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
        return fsspec_deps.strip_protocol(self.fs, path)

    def _object(self, backend_path: str) -> ObjectId:
        """Which object ``backend_path`` names on this backend: its cache key and display
        text. Remembered per instance (its backend, and so the location, never changes):
        a cache hit should not pay for hashing the URL again."""
        found = self._objects.get(backend_path)
        if found is None:
            found = object_id(self.fs, backend_path)
            if len(self._objects) >= _REMEMBERED_OBJECTS:
                self._objects.clear()
            self._objects[backend_path] = found
        return found

    def _count(self, name: str, amount: int = 1) -> None:
        if not amount:
            return
        cache = self.shard_cache
        if cache is not None:
            cache.incr(name, amount)
        else:
            with _MEMORY_COUNTERS_LOCK:
                self._memory_counters[name] = self._memory_counters.get(name, 0) + amount

    def _target(self, backend_path: str) -> Target:
        manifest = self.manifest
        return Target(
            fs=self.fs,
            path=backend_path,
            obj=self._object(backend_path),
            policy=self.policy,
            verify=self.options.verify,
            manifest=tuple(manifest.known(backend_path)) if manifest is not None else (),
            count=self._count,
            transport=self.download_transport,
            ranges_in_flight=self.options.ranges_in_flight,
            plan_dir=self.options.cache_dir if self.options.cache else None,
            min_rate=self.options.min_rate,
            rate_window=self.options.min_rate_window,
        )

    def _retried(self, method: str, backend_path: Any, *args: Any, **kwargs: Any) -> Any:
        """``backend.<method>(backend_path, ...)`` with retries, on fresh listings."""
        single = isinstance(backend_path, str)
        self.fs.invalidate_cache(backend_path if single else None)
        return self.policy.call(
            lambda: call(
                self.fs, method, backend_path, *args, timeout=self.policy.timeout, **kwargs
            ),
            self._object(backend_path).shown if single else method,
            method,
            lambda: self._count("retries"),
            hide=tuple(backend_path) if isinstance(backend_path, list) else (backend_path,),
        )

    # -- the cache ---------------------------------------------------------------------

    def cache_stats(self) -> dict[str, Any]:
        """Counters (hits, misses, bytes_downloaded, retries, integrity_failures, evictions)
        and the cache's content (cached_files, cached_bytes)."""
        cache = self.shard_cache
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

    def clear_cache(self) -> None:
        """Remove every cached file (and, with the cache off, reset the counters)."""
        cache = self.shard_cache
        if cache is not None:
            cache.clear()
        else:
            with _MEMORY_COUNTERS_LOCK:
                self._memory_counters.update(dict.fromkeys(COUNTERS, 0))

    def prefetch(self, path: str) -> str | None:
        """Make sure ``path`` is in the cache; its local path (None when it is not cached:
        the cache is off, read-only or too small, or the file was written meanwhile)."""
        if not self.options.cache:
            return None
        backend_path = self._backend_path(path)
        obj = self._object(backend_path)
        if not self.options.check_stale:
            local = self.shard_cache.get(obj, count=False)
            if local is not None:
                return local
        handle = self._open_cached(backend_path, obj)
        if handle is None:
            return None
        self._process.prefetched.add(obj.key)
        with handle:
            wait = getattr(handle.raw, "wait_until_cached", None)
            if wait is not None:  # still filling (with a block manifest): let it finish
                wait()
        return self.shard_cache.get(obj, count=False)

    def _cached_handle(self, backend_path: str, obj: ObjectId | None = None) -> CachedFile | None:
        """The cached copy opened for reading, or None; drops it first if it went stale."""
        cache = self.shard_cache
        obj = obj or self._object(backend_path)
        if self.options.check_stale and not self._still_fresh(cache, obj, backend_path):
            cache.discard(obj)
            return None
        prefetched = self._process.prefetched
        raw = cache.open(obj, count=obj.key not in prefetched)
        prefetched.discard(obj.key)
        return None if raw is None else CachedFile(raw, self, backend_path)

    def _still_fresh(self, cache: Any, obj: ObjectId, backend_path: str) -> bool:
        metadata = cache.metadata(obj)
        if metadata is None:
            return True
        validated = metadata.get("validated_at") or 0
        if self.options.stale_ttl is not None and time.time() - validated < self.options.stale_ttl:
            return True
        info = self._retried("info", backend_path)
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
        such races the file is streamed uncached.
        """
        from fsspec_shards.storage.cache import (
            CacheFullError,
            ReadOnlyCacheError,
            WrittenWhileReadingError,
        )

        obj = obj or self._object(backend_path)
        handle = self._cached_handle(backend_path, obj)
        if handle is not None:
            return handle
        cache = self.shard_cache
        for _ in range(_WRITE_RACE_ATTEMPTS):
            since = cache.generation(obj)
            target = self._target(backend_path)
            info = target.stat()
            try:
                blocks = self._blocks_of(backend_path)
                if blocks is not None:
                    raw = self._open_filling(backend_path, obj, target, info, blocks, since)
                else:
                    fill = self._filler(obj, target, info)
                    raw = cache.fetch(obj, fill, expected_size=info.get("size"), since=since)
            except CacheFullError as exc:
                warnings.warn(f"not caching {obj.shown}: {exc}; streaming it instead", stacklevel=3)
                return None
            except ReadOnlyCacheError:
                return None
            except WrittenWhileReadingError:
                continue
            return CachedFile(raw, self, backend_path)
        return None

    def _blocks_of(self, backend_path: str) -> BlockList | None:
        """The block manifest's entry of ``backend_path`` (None without one, or when
        checksums are not verified)."""
        manifest = self.manifest
        if manifest is None or self.options.verify != "auto":
            return None
        return manifest.lookup_blocks(backend_path)

    def _open_filling(
        self,
        backend_path: str,
        obj: ObjectId,
        target: Target,
        info: dict,
        blocks: BlockList,
        since: int,
    ) -> io.RawIOBase:
        """The object from the cache, readable block by block while it fills
        (:mod:`.cache.following`)."""
        from fsspec_shards.storage.cache.following import open_while_filling
        from fsspec_shards.storage.transfer.blocks import BlockProgress

        def fill(out: BinaryIO, progress: BlockProgress) -> dict:
            download_blocks = lambda into: planner.fill(  # noqa: E731
                target, into, info, blocks=blocks, progress=progress
            )
            return self._filler(obj, target, info, download_blocks)(out)

        return open_while_filling(
            self.shard_cache, obj, blocks, fill, since, lambda: self._reopen_raw(backend_path)
        )

    def _reopen_raw(self, backend_path: str) -> io.RawIOBase:
        """The object open again from the cache, as a raw file (a reader whose fill ended
        goes on with it)."""
        handle = self._open_cached(backend_path)
        if handle is None:
            raise OSError(f"{self._object(backend_path).shown} can no longer be cached")
        return handle.detach()

    def _filler(
        self,
        obj: ObjectId,
        target: Target,
        info: dict,
        fetch: Callable[[BinaryIO], dict] | None = None,
    ) -> Any:
        """What fills a local miss: the shared tier when there is one (which downloads from
        the backend, and keeps a copy, only when it lacks this version), else the backend."""
        shared = self.shared_tier
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
            self._count("shared_hits" if source == "shared" else "shared_misses")
            return metadata

        return fill

    def _drop_cached(self, backend_paths: Any) -> None:
        """Drop the cached copies of ``backend_paths`` after a write, and stop downloads of
        them in flight (in any process) from publishing; every host's next read of them
        skips the shared tier's copies made before (a new write generation there)."""
        paths = backend_paths if isinstance(backend_paths, list) else [backend_paths]
        if self.options.cache and self.options.shared_cache_dir is not None:
            for path in paths:
                self.shared_tier.new_generation(self._object(path))
        if not self.options.cache or not os.path.isdir(self.options.cache_dir):
            return  # no cache directory: nothing was ever cached there
        cache = self.shard_cache
        for path in paths:
            cache.discard(self._object(path))

    @contextlib.contextmanager
    def _writing(self, backend_paths: Any) -> Iterator[None]:
        """The one invalidation rule, around every write through the layer: the cached
        copies of every path written are dropped (under the key reads use,
        :func:`~fsspec_shards.storage.backends.identity.keyed_path`) before the write and again
        after it, failed or not, so neither a copy cached before nor a download that
        looked at the backend before the write's end is served afterwards."""
        self._drop_cached(backend_paths)
        try:
            yield
        finally:
            self._drop_cached(backend_paths)

    # -- reading -----------------------------------------------------------------------

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict | None = None,
        **kwargs: Any,
    ):
        backend_path = self._backend_path(path)
        if "r" not in mode:  # the cached copy is dropped now, at close, commit and discard
            self._drop_cached(backend_path)
            handle = self.fs.open(
                backend_path, mode, block_size=block_size, autocommit=autocommit, **kwargs
            )
            return DropCachedOnClose(handle, lambda: self._drop_cached(backend_path))
        if self.options.cache:
            handle = self._open_cached(backend_path)
            if handle is not None:
                return handle
        target = self._target(backend_path)
        info = target.stat()
        if info.get("size") is None:  # no ranged reads without a size: spool it whole
            with tempfile.TemporaryFile() as spool:
                planner.fill(target, spool, info)
                spool.flush()
                raw = io.FileIO(os.dup(spool.fileno()), "rb")
            raw.seek(0)
            return CachedFile(raw, self, backend_path)
        blocks = self._blocks_of(backend_path)
        block_size = block_size or self.options.block_size
        if blocks is not None:
            return BlockCheckedFile(self, target, info, block_size, blocks)
        return RetryingFile(self, target, info, block_size)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes of ``path`` (``[start, end)``, negative from the end), from the cached copy;
        a miss fills the cache with the whole verified file (with ``ranged_reads="direct"``
        a ranged miss reads just the range)."""
        backend_path = self._backend_path(path)
        whole = start in (None, 0) and end is None
        handle = self._local_copy(backend_path, fill=whole or self.options.ranged_reads == "cache")
        if handle is not None:
            with handle:
                return _read_local_range(handle, start, end)
        target = self._target(backend_path)
        info = target.stat()
        if whole:
            buffer = io.BytesIO()
            planner.fill(target, buffer, info)
            return buffer.getvalue()
        return self._read_backend_ranges(target, [(start, end)], info)[0]

    def _local_copy(self, backend_path: str, fill: bool) -> BinaryIO | None:
        """The cached copy opened for reading; with ``fill``, downloaded on a miss. None with
        the cache off, on a miss without ``fill``, or when the file cannot be cached."""
        if not self.options.cache:
            return None
        return self._open_cached(backend_path) if fill else self._cached_handle(backend_path)

    def _read_backend_ranges(
        self, target: Target, ranges: list[tuple[int | None, int | None]], info: dict
    ) -> list[bytes]:
        """Byte ranges straight from the backend, retried and resumed, all of one version of
        the object: identity- and size-checked on every response (no checksum: a range
        cannot be verified alone). A change of version reads them again from the new one;
        answers that prove no version (``versions.Unproven``) get the object read whole, the
        one shape in which they are used, and the ranges cut from it."""
        changed: VersionMismatch | None = None
        for _ in range(self.policy.attempts):
            expect = target.expect(info).version
            try:
                return [self._read_backend_range(target, *bounds, expect) for bounds in ranges]
            except VersionMismatch as exc:
                changed = exc
            except Unproven:  # answers prove no version: the object whole, then the ranges
                with tempfile.TemporaryFile() as spool:  # on disk: the object may be large
                    planner.fill(target, spool, info)
                    return [_read_local_range(spool, *bounds) for bounds in ranges]
            logger.info("%s changed while its ranges were read: reading again", target.shown)
            info = target.stat()
        raise changed

    def _read_backend_range(
        self, target: Target, start: int | None, end: int | None, expect: Version
    ) -> bytes:
        """``[start, end)`` of the version ``expect`` straight from the backend."""
        first, last = _resolve_range(start, end, expect.size)
        if first >= last:
            return b""
        return read_range(target, first, last, expect, lambda n: self._count("bytes_downloaded", n))

    def cat_ranges(
        self,
        paths: list[str],
        starts: int | list[int | None] | None,
        ends: int | list[int | None] | None,
        max_gap: int | None = None,
        on_error: str = "return",
        **kwargs: Any,
    ) -> list[bytes | Exception]:
        """Several ranges; each path is stat-ed and opened once, whatever its number of ranges."""
        count = len(paths)
        starts = starts if isinstance(starts, list) else [starts] * count
        ends = ends if isinstance(ends, list) else [ends] * count
        if len(starts) != count or len(ends) != count:
            raise ValueError("cat_ranges: paths, starts and ends must have the same length")
        results: list[bytes | Exception] = [b""] * count
        by_path: dict[str, list[int]] = {}
        for index, path in enumerate(paths):
            by_path.setdefault(self._backend_path(path), []).append(index)
        for backend_path, indices in by_path.items():
            error: Exception | None = None
            try:
                self._cat_path_ranges(backend_path, indices, starts, ends, results)
            except Exception as exc:
                error = exc
            if error is None:
                continue
            if on_error == "raise":
                raise error
            for index in indices:
                results[index] = clean_error(error, backend_path)
        return results

    def _cat_path_ranges(
        self,
        backend_path: str,
        indices: list[int],
        starts: list[int | None],
        ends: list[int | None],
        results: list[bytes | Exception],
    ) -> None:
        handle = self._local_copy(backend_path, fill=self.options.ranged_reads == "cache")
        if handle is not None:
            with handle:
                for index in indices:
                    results[index] = _read_local_range(handle, starts[index], ends[index])
            return
        target = self._target(backend_path)
        ranges = [(starts[index], ends[index]) for index in indices]
        datas = self._read_backend_ranges(target, ranges, target.stat())
        for index, data in zip(indices, datas, strict=True):
            results[index] = data

    # -- metadata, delegated with retries ----------------------------------------------

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._retried("info", self._backend_path(path), **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        return self._retried("ls", self._backend_path(path), detail=detail, **kwargs)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        return self._retried(
            "find",
            self._backend_path(path),
            maxdepth=maxdepth,
            withdirs=withdirs,
            detail=detail,
            **kwargs,
        )

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        return self._retried("glob", self._backend_path(path), maxdepth=maxdepth, **kwargs)

    def exists(self, path: str, **kwargs: Any) -> bool:
        """Whether ``path`` exists; transient failures are retried, not taken for absence."""
        try:
            self.info(path, **kwargs)
        except FileNotFoundError:
            return False
        return True

    def isdir(self, path: str) -> bool:
        try:
            return self.info(path)["type"] == "directory"
        except FileNotFoundError:
            return False

    def isfile(self, path: str) -> bool:
        try:
            return self.info(path)["type"] == "file"
        except FileNotFoundError:
            return False

    def size(self, path: str) -> int | None:
        return self.info(path).get("size")

    def checksum(self, path: str) -> int:
        return self._retried("checksum", self._backend_path(path))

    def ukey(self, path: str) -> str:
        return self._retried("ukey", self._backend_path(path))

    def modified(self, path: str) -> Any:
        return self._retried("modified", self._backend_path(path))

    def created(self, path: str) -> Any:
        return self._retried("created", self._backend_path(path))

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget the backend's listings and, for a path, the cached copy of that path too
        (a poisoned entry, e.g. a shard found malformed, is downloaded again next time)."""
        backend_path = None if path is None else self._backend_path(path)
        self.fs.invalidate_cache(backend_path)
        if backend_path is None:
            return
        self._drop_cached(backend_path)

    # -- writing: straight to the backend, each write inside ``_writing`` ----------------

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        backend_path = self._backend_path(path)
        with self._writing(backend_path):
            self.fs.pipe_file(backend_path, value, **kwargs)

    def put_file(self, lpath: str, rpath: str, **kwargs: Any) -> None:
        backend_path = self._backend_path(rpath)
        with self._writing(backend_path):
            self.fs.put_file(lpath, backend_path, **kwargs)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        destination = self._backend_path(path2)
        with self._writing(destination):
            self.fs.cp_file(self._backend_path(path1), destination, **kwargs)

    def mv(self, path1: str, path2: str, recursive: bool = False, **kwargs: Any) -> None:
        """Move, dropping the copies of the sources and of every path the move can write
        (``mv(src, "dir/")`` writes ``dir/<name>``)."""
        source, destination = self._backend_path(path1), self._backend_path(path2)
        sources = self.fs.expand_path(source, recursive=True)  # local moves always recurse
        with self._writing(sources + _move_targets(sources, destination)):
            self.fs.mv(source, destination, recursive, **kwargs)

    def rm_file(self, path: str) -> None:
        backend_path = self._backend_path(path)
        with self._writing(backend_path):
            self.fs.rm_file(backend_path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        backend_paths = self._backend_path(path)
        removed = self.fs.expand_path(backend_paths, recursive=recursive, maxdepth=maxdepth)
        with self._writing(removed):
            self.fs.rm(backend_paths, recursive=recursive, maxdepth=maxdepth)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.fs.mkdir(self._backend_path(path), create_parents=create_parents, **kwargs)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.fs.makedirs(self._backend_path(path), exist_ok=exist_ok)

    def rmdir(self, path: str) -> None:
        self.fs.rmdir(self._backend_path(path))

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        backend_path = self._backend_path(path)
        with self._writing(backend_path):
            self.fs.touch(backend_path, truncate=truncate, **kwargs)

    def setxattr(self, path: str, **kwargs: Any) -> Any:
        """The backend's ``setxattr`` (s3fs: a copy of the object onto itself, a new version)."""
        return self._set_attributes("setxattr", path, kwargs)

    def setxattrs(self, path: str, **kwargs: Any) -> Any:
        """The backend's ``setxattrs`` (gcsfs, adlfs: Azure gives the blob a new ETag)."""
        return self._set_attributes("setxattrs", path, kwargs)

    def _set_attributes(self, method: str, path: str, kwargs: dict) -> Any:
        backend_path = self._backend_path(path)
        if not callable(getattr(self.fs, method, None)):
            raise NotImplementedError(
                f"the {protocol_of(self.fs)} backend has no {method}(); "
                f"cannot set attributes of {self._object(backend_path).shown}"
            )
        with self._writing(backend_path):
            return getattr(self.fs, method)(backend_path, **kwargs)


def _move_targets(sources: list[str], destination: Any) -> list[str]:
    """Every path a move of ``sources`` (expanded, directories included) to ``destination``
    can write, whichever rule the backend follows: fsspec's copy rules, into an existing
    directory or not, flattened or not, and ``shutil.move``'s for local files. A superset:
    dropping a copy that was not written costs a download, missing one serves stale bytes."""
    if isinstance(destination, list):
        return list(destination)
    targets = {destination}
    for exists in (False, True):
        for flatten in (False, True):
            targets.update(other_paths(sources, destination, exists=exists, flatten=flatten))
    return sorted(targets)


def _rebuilt_after_fork(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """A backend given by the user, for a forked child: an async one is bound to the parent's
    event loop (fsspec refuses it after a fork), so an equal one is built from its arguments."""
    if not getattr(fs, "async_impl", False):
        return fs
    return type(fs)(*fs.storage_args, **fs.storage_options)


def _resolve_range(start: int | None, end: int | None, size: int | None) -> tuple[int, int]:
    """``[start, end)`` as absolute offsets, with Python's negative-index and clamping rules."""
    if size is None:
        if (start or 0) < 0 or end is None or end < 0:
            raise ValueError("a negative or open-ended range needs the object's size")
        return start or 0, end
    first = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
    last = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
    return first, max(first, last)


def _read_local_range(handle: BinaryIO, start: int | None, end: int | None) -> bytes:
    size = handle.seek(0, io.SEEK_END)  # (a file still filling has its final size too)
    first, last = _resolve_range(start, end, size)
    handle.seek(first)
    return handle.read(last - first)


def _raising_clean_errors(cls: type) -> None:
    """Wrap every public method of ``cls`` (and ``_open``, behind ``open``) so that what it
    raises carries no secret in its text or its cause/context chain."""
    for name, member in list(vars(cls).items()):
        if (name == "_open" or not name.startswith("_")) and inspect.isfunction(member):
            setattr(cls, name, raising_clean(member))


_raising_clean_errors(WdsFileSystem)
