"""``WdsFileSystem``: the ``wds`` fsspec protocol, a retrying, verifying, caching wrapper.

``wds::s3://bucket/train-0001.tar`` reads the object through any fsspec backend. This module
is the fsspec adapter: it parses the options, maps paths to the backend's, delegates listing
and metadata to the backend with retries, sends writes straight to the backend inside the
one invalidation rule (:meth:`WdsFileSystem._writing`), and hands reads to this process's
:class:`~fsspec_shards.storage.fetcher.Fetcher` (the cache, its fills, ranges, prefetch).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.core import split_protocol
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.registry import known_implementations, registry
from fsspec.utils import other_paths, stringify_path

from fsspec_shards import option_shapes
from fsspec_shards.redact import clean_error, install_log_redaction, raising_clean
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.accepted_options import check_backend_options
from fsspec_shards.storage.backends.base import FSSPEC_INSTANCE_OPTIONS, protocol_of
from fsspec_shards.storage.core.options import StorageOptions
from fsspec_shards.storage.deps import fsspec as fsspec_deps
from fsspec_shards.storage.fetcher import Fetcher
from fsspec_shards.storage.files import DropCachedOnClose

if TYPE_CHECKING:
    from fsspec_shards.storage.cache import ShardCache
    from fsspec_shards.storage.transfer.streams import Transport


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
        if fs is None:
            check_backend_options(target_protocol, target_options or {})
        self._fetcher = Fetcher(self.options, self, target_protocol, target_options, fs)
        install_log_redaction()  # the loggers of what the check and the fetcher imported
        # the options' retry policy, its time-out shortened to the backend's if shorter
        self.policy = self._fetcher.policy

    @classmethod
    def from_url(cls, url: str, **options: Any) -> tuple[WdsFileSystem, str] | None:
        """What ``fsspec.core.url_to_fs(url, **options)`` gives for a chain of one backend,
        ``wds::<backend URL>`` with options in sections (``{"wds": ..., "s3": ...}``): the
        same instance and path, without importing the backend's class where its backend
        names paths without it (:attr:`Backend.unbuilt`: s3fs's import costs 0.3-0.7 s and
        a read through obstore never needs it). None for any other URL (more hops, a query,
        a fragment, options out of sections, a backend not imported that has no stand-in):
        ``url_to_fs`` then resolves it."""
        layer, _, inner = url.partition("::")
        protocol = split_protocol(inner)[0]
        if layer != cls.protocol or not protocol or set(options) - {layer, protocol}:
            return None
        if "::" in inner or "?" in inner or "#" in inner:
            return None
        names = _naming_class(protocol)
        own = dict(options.get(layer) or {})
        if names is None or {"target_protocol", "target_options", "fo"} & set(own):
            return None
        url_options = fsspec_deps.kwargs_from_url
        if url_options(names, inner) or url_options(cls, f"{layer}://"):
            return None
        path = fsspec_deps.strip_protocol(names, inner)
        if not path:
            return None
        target = dict(options.get(protocol) or {})
        fs = fsspec.filesystem(
            layer, **own, target_options=target, target_protocol=protocol, fo=path
        )
        return fs, path

    # -- the fetcher (per process) -------------------------------------------------------

    @property
    def fetcher(self) -> Fetcher:
        """This process's :class:`Fetcher` (a forked child builds its own on first use)."""
        fetcher = self._fetcher
        if fetcher.pid != os.getpid():
            fetcher = self._fetcher = fetcher.in_this_process()
        return fetcher

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The backend: the one given, or the tamed one built for this process."""
        return self.fetcher.built_fs

    @property
    def download_transport(self) -> Transport:
        """What downloads go through (the ``transport`` option), chosen when the filesystem
        is made, and again in a forked child (obstore does not survive ``fork()`` once used)."""
        return self.fetcher.transport

    @property
    def shard_cache(self) -> ShardCache | None:
        """The :class:`ShardCache` behind this filesystem (None with ``cache=False``)."""
        return self.fetcher.cache

    # -- paths -------------------------------------------------------------------------

    def _backend_path(self, path: Any) -> Any:
        if isinstance(path, list | tuple):
            return [self._backend_path(p) for p in path]
        path = stringify_path(path)
        for prefix in ("wds::", "wds://"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
        return fsspec_deps.strip_protocol(self.fetcher.fs, path)  # a stand-in names paths too

    # -- the cache ---------------------------------------------------------------------

    def cache_stats(self) -> dict[str, Any]:
        """Counters (hits, misses, bytes_downloaded, retries, integrity_failures, evictions)
        and the cache's content (cached_files, cached_bytes)."""
        return self.fetcher.stats()

    def clear_cache(self) -> None:
        """Remove every cached file (and, with the cache off, reset the counters)."""
        self.fetcher.clear()

    def prefetch(self, path: str) -> str | None:
        """Make sure ``path`` is in the cache; its local path (None when it is not cached:
        the cache is off, read-only or too small, or the file was written meanwhile)."""
        return self.fetcher.prefetch(self._backend_path(path))

    @contextlib.contextmanager
    def _writing(self, backend_paths: Any) -> Iterator[None]:
        """The one invalidation rule, around every write through the layer: the cached
        copies of every path written are dropped (under the key reads use,
        :func:`~fsspec_shards.storage.backends.keyed_path`) before the write and again
        after it, failed or not, so neither a copy cached before nor a download that
        looked at the backend before the write's end is served afterwards."""
        self.fetcher.drop_cached(backend_paths)
        try:
            yield
        finally:
            self.fetcher.drop_cached(backend_paths)

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
        if "r" in mode:
            return self.fetcher.open(backend_path, block_size)
        # writing: the cached copy is dropped now, at close, commit and discard
        drop = lambda: self.fetcher.drop_cached(backend_path)  # noqa: E731
        drop()
        handle = self.fs.open(
            backend_path, mode, block_size=block_size, autocommit=autocommit, **kwargs
        )
        return DropCachedOnClose(handle, drop)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """Bytes of ``path`` (``[start, end)``, negative from the end), from the cached copy;
        a miss fills the cache with the whole verified file (with ``ranged_reads="direct"``
        a ranged miss reads just the range)."""
        return self.fetcher.cat(self._backend_path(path), start, end)

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
            ranges = [(starts[index], ends[index]) for index in indices]
            try:
                datas: list[bytes | Exception] = self.fetcher.read_ranges(backend_path, ranges)
            except Exception as exc:
                if on_error == "raise":
                    raise
                datas = [clean_error(exc, backend_path) for _ in indices]
            for index, data in zip(indices, datas, strict=True):
                results[index] = data
        return results

    # -- metadata, delegated with retries ----------------------------------------------

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.fetcher.retried("info", self._backend_path(path), **kwargs)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list:
        return self.fetcher.retried("ls", self._backend_path(path), detail=detail, **kwargs)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        return self.fetcher.retried(
            "find",
            self._backend_path(path),
            maxdepth=maxdepth,
            withdirs=withdirs,
            detail=detail,
            **kwargs,
        )

    def glob(self, path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        return self.fetcher.retried("glob", self._backend_path(path), maxdepth=maxdepth, **kwargs)

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
        return self.fetcher.retried("checksum", self._backend_path(path))

    def ukey(self, path: str) -> str:
        return self.fetcher.retried("ukey", self._backend_path(path))

    def modified(self, path: str) -> Any:
        return self.fetcher.retried("modified", self._backend_path(path))

    def created(self, path: str) -> Any:
        return self.fetcher.retried("created", self._backend_path(path))

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget the backend's listings and, for a path, the cached copy of that path too
        (a poisoned entry, e.g. a shard found malformed, is downloaded again next time)."""
        backend_path = None if path is None else self._backend_path(path)
        self.fetcher.fs.invalidate_cache(backend_path)
        if backend_path is None:
            return
        self.fetcher.drop_cached(backend_path)

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
                f"cannot set attributes of {self.fetcher.object(backend_path).shown}"
            )
        with self._writing(backend_path):
            return getattr(self.fs, method)(backend_path, **kwargs)


def _naming_class(protocol: str) -> Any:
    """What names paths as backend ``protocol``'s class does, without importing it: the class
    where it is imported already, else its backend's stand-in (None: neither)."""
    if protocol in registry:
        return registry[protocol]
    known = known_implementations.get(protocol)
    if known is not None and known["class"].rsplit(".", 1)[0] in sys.modules:
        return fsspec.get_filesystem_class(protocol)
    unbuilt = backend_for(protocol).unbuilt
    if unbuilt is not None and protocol == unbuilt.protocol[0]:
        return unbuilt
    return None


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


def _raising_clean_errors(cls: type) -> None:
    """Wrap every public method of ``cls`` (and ``_open``, behind ``open``) so that what it
    raises carries no secret in its text or its cause/context chain."""
    for name, member in list(vars(cls).items()):
        if (name == "_open" or not name.startswith("_")) and inspect.isfunction(member):
            setattr(cls, name, raising_clean(member))


_raising_clean_errors(WdsFileSystem)
