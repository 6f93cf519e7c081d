"""What the backends' obstore mappings are written with (``obstore_options`` applies them).

A backend module maps the user's fsspec options onto a :class:`StoreSpec` with
:class:`Options`: options are consumed one by one (:meth:`Options.pick` takes the first
of several sources, a table row), and whatever is left at the end was not mapped and is
refused by name (:class:`Refused`), unless the backend lists it as not changing which
bytes a GET returns or how it is authorised.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsspec_shards.config import bool_word

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
