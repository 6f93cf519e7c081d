"""The backend interface: what the wds layer needs to know about one backend, one subclass
of :class:`Backend` per backend (``backends/<backend>.py``), looked up by protocol
(``backends.backend_for``).

- Where its objects live beyond the path (:meth:`Backend.location`, for the cache key).
- Which ``info()`` fields name a version (``version_fields``) and carry checksums
  (``checksum_fields``, :meth:`Backend.checksums`); the object's identity
  (:meth:`Backend.identity`, kept with cache entries) is derived from the version fields.
- Where obstore's HEAD gives its ``info()`` (:meth:`Backend.info_from_head`).
- Its socket time-outs and the taming of its own retries (:meth:`Backend.tamed_options`,
  :meth:`Backend.tame_instance`, :meth:`Backend.timeout`).
- How its library names failures (``errors``, which ``core/retry.py`` classifies).
- Its streaming GET (:meth:`Backend.open_range`; ``transfer/streams.py`` pumps the body).
- Which options it takes (:meth:`Backend.passed_on`, ``option_tables``;
  ``accepted_options`` applies them) and its obstore store (:meth:`Backend.obstore_store`;
  ``obstore_options`` applies it), written with this module's vocabulary:

A backend module maps the user's fsspec options onto a :class:`StoreSpec` with
:class:`Options`: options are consumed one by one (:meth:`Options.pick` takes the first
of several sources, a table row), and whatever is left at the end was not mapped and is
refused by name (:class:`Refused`), unless the backend lists it as not changing which
bytes a GET returns or how it is authorised.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import hashlib
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import fsspec
from fsspec.asyn import sync

from fsspec_shards.config import bool_word
from fsspec_shards.storage.backends.versions import Facts, Version, VersionFields
from fsspec_shards.storage.core.integrity import Checksum
from fsspec_shards.storage.core.retry import ErrorNames

FSSPEC_INSTANCE_OPTIONS = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "asynchronous",
        "loop",
    }
)
"""Options every fsspec filesystem takes: its instance cache, listing cache and async mode
(none says where its objects live)."""

IGNORED_COMMON = FSSPEC_INSTANCE_OPTIONS | frozenset(
    {
        "default_block_size",
        "block_size",
        "blocksize",
        "default_fill_cache",
        "default_cache_type",
        "cache_type",
        "cache_options",
        "max_concurrency",
        "timeout",
    }
)
"""Options of every backend that change no GET: caching, listing, upload and pool
settings, and their own time-outs (the transport applies ours)."""


@dataclass(frozen=True, eq=False)
class StoreSpec:
    """How to build obstore stores for one backend configuration.

    ``config`` and ``client`` may hold secrets (never display them); ``secrets`` lists the
    values to mask in any text; ``shown`` describes the store for logs without them.
    """

    kind: str  # "s3" | "gcs" | "azure" | "http"
    config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    client: Mapping[str, Any] = field(default_factory=dict, repr=False)
    credentials: Callable[[], Any] | None = field(default=None, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    shown: str = ""
    bucket_region: bool = False  # AWS with no region known: ask the bucket for its region

    @property
    def key(self) -> str:
        """A digest naming this configuration (for the store cache; shows no secret): equal
        options give equal keys, so transports made from them share stores."""
        provider = getattr(self.credentials, "cache_key", None) or id(self.credentials)
        text = repr((self.kind, sorted(self.config.items()), sorted(self.client.items()), provider))
        return hashlib.sha256(text.encode()).hexdigest()


class Refused(Exception):
    """Option ``option`` cannot be carried over to obstore, for ``reason`` (redacted)."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(option, reason)
        self.option = option
        self.reason = reason


class Options:
    """The user's options, consumed one by one; what is left at the end was not mapped."""

    def __init__(self, options: Mapping[str, Any], prefix: str = "") -> None:
        if not isinstance(options, Mapping):
            raise Refused(prefix.rstrip(".") or "options", "is not a mapping")
        self.given = dict(options)
        self._left = dict(options)
        self._prefix = prefix
        self._nested: dict[str, Options] = {}

    def name(self, key: str) -> str:
        return self._prefix + key

    def take(self, key: str, default: Any = None) -> Any:
        value = self._left.pop(key, None)
        return default if value is None else value

    def nested(self, key: str) -> Options:
        """The table option ``key`` (``client_kwargs``, ...), consumed the same way."""
        if key not in self._nested:
            self._nested[key] = Options(self.take(key, {}), self.name(key) + ".")
        return self._nested[key]

    def pick(self, *sources: str, default: Any = None) -> Any:
        """The first value given by ``sources``, each an option name, ``table.name`` for a
        table option's entry, or ``$NAME`` for an environment variable; every option
        source is consumed."""
        found = None
        for source in sources:
            if source.startswith("$"):
                value = os.environ.get(source[1:]) or None
            elif "." in source:
                table, _, name = source.partition(".")
                value = self.nested(table).take(name)
            else:
                value = self.take(source)
            if found is None:
                found = value
        return default if found is None else found

    def remaining(self) -> list[str]:
        """The names not taken yet."""
        return sorted(self._left)

    def refused(self, key: str, reason: str) -> Refused:
        """The refusal of option ``key`` (to raise)."""
        return Refused(self.name(key), reason)

    def finish(self, ignored: frozenset[str] = frozenset()) -> None:
        """Refuse the first option left that is not ``ignored``."""
        for key in self.remaining():
            if key not in ignored:
                raise self.refused(key, "has no obstore equivalent")


def as_bool(options: Options, key: str, value: Any) -> bool:
    """``value`` of option ``key`` as a boolean (``True``, ``"false"``, ``"1"``, ...)."""
    if isinstance(value, bool):
        return value
    if bool_word(value) is not None:
        return bool_word(value)
    raise options.refused(key, f"expected a boolean, got a {type(value).__name__}")


def tls(options: Options, key: str, verify: Any) -> dict[str, Any]:
    """Client options for a ``verify`` setting: a CA bundle file, ``False``, or ``True``."""
    if verify is None or verify is True:
        return {}
    if verify is False:
        return {"allow_invalid_certificates": True}
    if isinstance(verify, str | os.PathLike):
        try:
            with open(verify, "rb") as handle:
                return {"root_certificate": handle.read()}
        except OSError as exc:
            raise options.refused(key, f"cannot read the CA bundle ({exc.strerror})") from None
    raise options.refused(key, f"a {type(verify).__name__} is not a CA bundle path or a boolean")


def http_endpoint(url: str) -> dict[str, Any]:
    """Client options an endpoint URL needs (plain HTTP must be allowed explicitly)."""
    return {"allow_http": True} if url.lower().startswith("http://") else {}


Read = Callable[[int], Awaitable[bytes]]
"""Reads the next piece of a response body (at most the size given; ``b""`` at its end)."""


def protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    """The backend's main protocol name."""
    protocol = fs.protocol
    return protocol[0] if isinstance(protocol, tuple | list) else protocol


def parameters(function: Callable) -> set[str]:
    """The named parameters of ``function`` (not ``self``, ``*args`` or ``**kwargs``): the
    options a backend or its client takes."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds and name != "self"
    }


def from_base64(value: Any) -> str | None:
    """The hex digest of a base64 digest (or of raw digest bytes); None if it is neither."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if not isinstance(value, str) or not value:
        return None
    try:
        return base64.b64decode(value, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


class Backend:
    """One backend's facts; the defaults are those of a backend that says nothing: no
    location beyond the path, no checksum, no socket, no retries of its own, no stream."""

    protocols: ClassVar[tuple[str, ...]] = ()
    version_fields: ClassVar[VersionFields] = VersionFields()
    checksum_fields: ClassVar[tuple[tuple[str, str, int], ...]] = ()
    """``(algorithm, info() field, hex digest length)`` of each base64 digest it gives."""
    remote: ClassVar[bool] = False
    """Whether it lists a server (its listing cache is then turned off)."""
    errors: ClassVar[ErrorNames] = ErrorNames()
    head_gives_info: ClassVar[bool] = False
    """Whether obstore's answer to a HEAD carries every field of ``info()`` that the version
    and checksum rules read (:meth:`info_from_head` then makes ``info()`` of it)."""
    option_tables: ClassVar[Mapping[str, Callable[[], set[str]]]] = {}
    """Its options that are tables of a client's keywords, and what each takes."""
    filesystem_options: ClassVar[frozenset[str] | None] = None
    """The options its fsspec class takes (its and its bases' ``__init__``'s, and what it
    passes on), where known without importing the class; None: read from the class."""
    unbuilt: ClassVar[Callable[[Mapping[str, Any], Callable[[], Any]], Any] | None] = None
    """A stand-in for its fsspec filesystem, made of the options and a function that builds
    the real one: it answers what the cache key, the time-outs, the transport's choice and
    path naming read without importing the class, and builds the real one for anything
    else; None: the filesystem is built at once."""

    def location(self, fs: fsspec.AbstractFileSystem) -> str:
        """Where instance ``fs``'s objects live beyond what the path says (the cache key)."""
        return ""

    def identity(self, info: Mapping[str, Any]) -> str:
        """A string that changes when the object is replaced: every version id and ETag
        field of :attr:`version_fields` that ``info`` gives, else its first modification
        time; always with the size."""
        fields = self.version_fields
        parts = [
            f"{name}={str(info[name]).strip(chr(34))}"
            for name in fields.version + fields.etag
            if info.get(name)
        ]
        if not parts:
            modified = next((name for name in fields.modified if info.get(name)), None)
            if modified is not None:
                parts.append(f"{modified}={info[modified]}")
        parts.append(f"size={info.get('size')}")
        return ";".join(parts)

    def checksums(self, info: Mapping[str, Any]) -> list[Checksum]:
        """The checksums ``info()`` carries (:attr:`checksum_fields`)."""
        found = []
        for algorithm, name, length in self.checksum_fields:
            hexdigest = from_base64(info.get(name))
            if hexdigest and len(hexdigest) == length:
                found.append(Checksum(algorithm, hexdigest))
        return found

    def socket_timeouts(self, fs: fsspec.AbstractFileSystem) -> list[Any]:
        """The socket time-outs configured on instance ``fs`` (any value; None: unset)."""
        return []

    def timeout(self, fs: fsspec.AbstractFileSystem) -> float | None:
        """The shortest socket time-out configured on instance ``fs``, or None."""
        numbers = [
            float(value)
            for value in self.socket_timeouts(fs)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        ]
        return min(numbers) if numbers else None

    def tamed_options(self, options: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """``options`` for building the backend, with its own retries at one attempt, its
        socket time-outs at ``timeout`` and its listing cache off; whatever the user set
        explicitly for retries and time-outs is kept."""
        options = dict(options)
        # a private instance (it is adjusted after it is built, see tame_instance: a user's
        # own instance of the same backend keeps its behaviour) whose listings are never stale
        options["skip_instance_cache"] = True
        if self.remote:
            options["use_listings_cache"] = False
        return self._tame_options(options, timeout)

    def _tame_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The backend's own part of :meth:`tamed_options`."""
        return options

    def tame_instance(self, fs: fsspec.AbstractFileSystem) -> None:
        """Turn down the retries that the backend only exposes on the built instance."""

    def file_info(
        self, fs: fsspec.AbstractFileSystem, path: str, timeout: float | None
    ) -> dict[str, Any]:
        """``fs.info(path)`` for a path about to be read as a file."""
        return call(fs, "info", path, timeout=timeout)

    def info_from_head(self, meta: Mapping[str, Any], name: str) -> dict[str, Any]:
        """``info()`` of object ``name`` from obstore's answer to a HEAD (where
        :attr:`head_gives_info`)."""
        raise NotImplementedError(f"{type(self).__name__}: obstore's HEAD is not its info()")

    def open_range(
        self,
        fs: fsspec.AbstractFileSystem,
        path: str,
        start: int,
        end: int | None,
        expect: Version | None,
        timeout: float | None,
    ) -> contextlib.AbstractAsyncContextManager[tuple[Facts, Read]] | None:
        """An async context of one GET of bytes ``[start, end)`` (conditional on ``expect``
        where the backend can), giving the response's facts and its body's reader; None
        where the backend has no streaming GET (it is read through ``cat_file``)."""
        return None

    def passed_on(self) -> set[str] | None:
        """The options the backend passes on beyond its own parameters; None where they go
        somewhere that cannot be listed (its options are then not checked)."""
        return None

    def obstore_store(self, options: Options) -> StoreSpec | None:
        """The obstore store for the backend's ``options`` (raises ``Refused`` naming an
        option that cannot be carried over); None where obstore has no store for it."""
        return None


def call(fs: fsspec.AbstractFileSystem, method: str, *args: Any, timeout: float | None, **kwargs):
    """``fs.<method>(*args, **kwargs)``; for async backends bounded by ``timeout`` seconds, so a
    stalled request raises ``fsspec.exceptions.FSTimeoutError`` (a ``TimeoutError``)."""
    coroutine = getattr(fs, "_" + method, None)
    if (
        timeout
        and getattr(fs, "async_impl", False)
        and not getattr(fs, "asynchronous", False)
        and coroutine is not None
    ):
        return sync(fs.loop, coroutine, *args, timeout=timeout, **kwargs)
    return getattr(fs, method)(*args, **kwargs)


async def within(awaitable: Awaitable, timeout: float | None) -> Any:
    """``awaitable``'s result; a wait over ``timeout`` seconds raises ``TimeoutError``."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(errno.ETIMEDOUT, f"no data from the server for {timeout:g}s") from None


def range_header(start: int, end: int | None) -> str:
    """The ``Range`` header of bytes ``[start, end)`` (``end`` None: to the object's end)."""
    return f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
