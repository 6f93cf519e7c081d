"""The ``wds`` options: one table of every option (default, parser, environment, doc line)
and :class:`StorageOptions`, the parsed values the filesystem and its downloads read.

The table is the one place a default lives: the filesystem, :class:`RetryPolicy`, the
download targets and the command line's storage flags take theirs from here, and tests hold
docs/configuration.md's table to it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from fsspec_shards import config
from fsspec_shards.errors import OptionError
from fsspec_shards.storage.core.retry import RetryPolicy

TRANSPORTS = ("auto", "obstore", "fsspec")
"""The values of the ``transport`` option."""
RANGED_READS = ("cache", "direct")
"""The values of the ``ranged_reads`` option."""


@dataclasses.dataclass(frozen=True)
class Option:
    """One ``wds`` option: its built-in default (a callable is asked at parse time: the
    user's cache directory), how a value is parsed, one line for the docs and ``--help``,
    and the environment variables that, when set, give the default first (first set wins)."""

    default: Any
    parse: Callable[[Any], Any]
    doc: str
    env: tuple[str, ...] = ()
    bytes: bool = False
    """A byte count (an int, or a string like ``"50GB"``)."""
    blank_is_default: bool = False
    """An empty string means the default too (a directory from an unset-looking variable)."""

    def parsed_default(self) -> Any:
        """The default, parsed: the first environment variable set, else the built-in
        (None: no value)."""
        for name in self.env:
            if os.environ.get(name):
                return _from_environment(name, self.parse)
        value = self.default() if callable(self.default) else self.default
        return None if value is None else self.parse(value)


def _from_environment(name: str, parse: Callable[[Any], Any]) -> Any:
    try:
        return parse(os.environ[name])
    except ValueError as exc:
        raise ValueError(f"environment variable {name}: {exc}") from None


def _size(name: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            return config.parse_size(value)
        except ValueError as exc:
            raise ValueError(f"invalid value for option {name!r}: {exc}") from None

    return parse


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in choices:
            raise ValueError(
                f"invalid value {value!r} for option {name!r}: expected one of {', '.join(choices)}"
            )
        return value

    return parse


def _directory(value: Any) -> str:
    return os.path.expanduser(str(value))


def _block_size(value: Any) -> int:
    # 0 is fsspec's "no read-ahead" (datasets streams with it): the default pieces then
    return _size("block_size")(value) or OPTIONS["block_size"].parsed_default()


def _checksums(value: Any) -> dict | str:
    if not isinstance(value, dict | str):
        raise ValueError(
            f"invalid value for option 'checksums': expected a mapping or a path, "
            f"got {type(value).__name__}"
        )
    return value


def parse_verify(value: Any) -> str | bool:
    """The ``verify`` option: ``"auto"``, ``"size"`` or ``False`` (strings from the
    environment like ``"false"``/``"0"`` mean False; ``True`` means ``"auto"``)."""
    if value is True:
        return "auto"
    if value is False or value is None:
        return False
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto" or config.bool_word(text) is True:
            return "auto"
        if text == "size":
            return "size"
        if text == "none" or config.bool_word(text) is False:
            return False
    raise ValueError(
        f"invalid value {value!r} for option 'verify': expected 'auto', 'size' or False"
    )


def parse_ranges_in_flight(value: Any) -> int | str:
    """The ``ranges_in_flight`` option: ``"auto"`` or an int >= 1 (also as a string)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ValueError(
            f"invalid value {value!r} for option 'ranges_in_flight': expected 'auto' or an "
            "integer >= 1"
        )
    return number


OPTIONS: Mapping[str, Option] = {
    "cache_dir": Option(
        lambda: str(config.user_cache_dir()),
        _directory,
        "where cached files live; processes giving the same directory share the cache",
        env=("FSSPEC_SHARDS_CACHE", "WDS_CACHE"),  # WDS_CACHE: webdataset's name
        blank_is_default=True,
    ),
    "cache_size": Option(
        config.DEFAULT_CACHE_SIZE,
        _size("cache_size"),
        'the most bytes the cache keeps: an int, or "50GB" / "1GiB"',
        env=("FSSPEC_SHARDS_CACHE_SIZE", "WDS_CACHE_SIZE"),
        bytes=True,
    ),
    "shared_cache_dir": Option(
        None,
        _directory,
        "a second cache tier on a filesystem every node mounts",
        env=("FSSPEC_SHARDS_SHARED_CACHE",),
        blank_is_default=True,
    ),
    "shared_cache_size": Option(
        config.DEFAULT_CACHE_SIZE,
        _size("shared_cache_size"),
        "the most bytes the shared tier keeps",
        env=("FSSPEC_SHARDS_SHARED_CACHE_SIZE",),
        bytes=True,
    ),
    "cache": Option(
        True,
        lambda value: config.parse_bool(value, "cache"),
        "False streams reads with the same retries and checks but keeps nothing on disk",
    ),
    "retries": Option(
        5,
        lambda value: config.parse_int(value, "retries", minimum=1),
        "the most attempts for one chain of transient failures",
    ),
    "backoff": Option(
        0.2,
        lambda value: config.parse_float(value, "backoff"),
        "seconds: the first backoff, doubled per consecutive failure, with full jitter",
    ),
    "max_backoff": Option(
        10.0,
        lambda value: config.parse_float(value, "max_backoff"),
        "seconds: the cap of one backoff",
    ),
    "deadline": Option(
        300.0,
        lambda value: config.parse_float(value, "deadline"),
        "seconds: no more retries once a failure chain is this old",
    ),
    "timeout": Option(
        30.0,
        lambda value: config.parse_float(value, "timeout", minimum=0.001),
        "seconds without progress after which a request counts as stalled",
    ),
    "min_rate": Option(
        16 * 1024,
        _size("min_rate"),
        "bytes/s below which a request counts as stalled (0: no floor)",
        bytes=True,
    ),
    "min_rate_window": Option(
        30.0,
        lambda value: config.parse_float(value, "min_rate_window", 0.001),
        "seconds over which min_rate is measured",
    ),
    "ranged_reads": Option(
        None,
        _choice("ranged_reads", RANGED_READS),
        '"cache" fills the cache for a ranged read, "direct" reads just the range '
        "(the default with cache=False)",
    ),
    "transport": Option(
        "auto",
        _choice("transport", TRANSPORTS),
        'what downloads go through: "auto", "obstore" or "fsspec"',
    ),
    "ranges_in_flight": Option(
        "auto",
        parse_ranges_in_flight,
        'ranged GETs at once filling a large versioned file: "auto" or an int',
    ),
    "verify": Option(
        "auto",
        parse_verify,
        '"auto" (size and the strongest checksum known), "size" or False',
    ),
    "checksums": Option(
        None,
        _checksums,
        'a manifest: a mapping path -> "sha256:<hex>", or the path/URL of a SHA256SUMS file',
    ),
    "block_size": Option(
        4 * 1024 * 1024,
        _block_size,
        "read size of streamed (uncached) files",
        bytes=True,
    ),
    "check_stale": Option(
        False,
        lambda value: config.parse_bool(value, "check_stale"),
        "compare a cached file's identity with the backend's before using it",
    ),
    "stale_ttl": Option(
        None,
        lambda value: config.parse_float(value, "stale_ttl"),
        "with check_stale, skip the comparison when the last one is younger (seconds)",
    ),
}
"""Every ``wds`` option, in the order docs/configuration.md lists them."""


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """The parsed ``wds`` options, one field per option of :data:`OPTIONS`."""

    cache_dir: str
    cache_size: int
    shared_cache_dir: str | None
    shared_cache_size: int
    cache: bool
    retries: int
    backoff: float
    max_backoff: float
    deadline: float
    timeout: float
    min_rate: int
    min_rate_window: float
    ranged_reads: str
    transport: str
    ranges_in_flight: int | str
    verify: str | bool
    checksums: dict | str | None
    block_size: int
    check_stale: bool
    stale_ttl: float | None

    @classmethod
    def parse(cls, **given: Any) -> StorageOptions:
        """Parse the options given (strings as from the environment too); the table's
        default for the others. A bad value raises ``ValueError`` naming the option, an
        unknown name :class:`~fsspec_shards.errors.OptionError`."""
        unknown = sorted(set(given) - set(OPTIONS))
        if unknown:
            raise OptionError(
                f"wds.{unknown[0]}",
                f"unknown option(s) for the wds filesystem: {', '.join(unknown)}; backend "
                "options belong in target_options, or in the backend's own section, e.g. "
                "storage_options={'wds': {...}, 's3': {...}}",
            )
        values = {name: _parsed(option, given.get(name)) for name, option in OPTIONS.items()}
        values["ranged_reads"] = _ranged_reads(values["ranged_reads"], values["cache"])
        return cls(**values)

    @property
    def retry_policy(self) -> RetryPolicy:
        """How hard requests try, from ``retries``, ``backoff``, ``max_backoff``,
        ``deadline`` and ``timeout``."""
        return RetryPolicy(
            attempts=self.retries,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            deadline=self.deadline,
            timeout=self.timeout,
        )


def default_of(name: str) -> Any:
    """The parsed default of one option (the environment's when set)."""
    return OPTIONS[name].parsed_default()


def _parsed(option: Option, value: Any) -> Any:
    """One option's value: the given one parsed, else its default."""
    if value is None or (option.blank_is_default and value == ""):
        return option.parsed_default()
    return option.parse(value)


def _ranged_reads(value: str | None, cache: bool) -> str:
    """``ranged_reads`` with ``cache``: "cache" by default, "direct" only without a cache."""
    if value is None:
        return "cache" if cache else "direct"
    if value == "cache" and not cache:
        raise ValueError(
            "invalid value 'cache' for option 'ranged_reads': with cache=False ranges can only "
            "be read direct"
        )
    return value
