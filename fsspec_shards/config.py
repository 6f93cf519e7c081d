"""Option parsing and defaults shared by the storage layer, the iteration module and the CLI."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

DEFAULT_CACHE_SIZE = 20 * 1024**3
"""Default upper bound of the cache: 20 GiB. Bounded so a forgotten cache cannot fill a disk."""

DEFAULT_MAX_MEMBER_SIZE = 1 << 30
"""Tar members larger than this (1 GiB, told by the header) make a shard malformed: a bound
on the memory one member may take, and on gzip bombs."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})
"""The words a boolean option or environment variable may be spelled with (any case)."""


def bool_word(value: Any) -> bool | None:
    """True or False for a string that says so (``"yes"``, ``"OFF"``, ...), else None."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    return True if text in TRUE_WORDS else False if text in FALSE_WORDS else None


def is_int(value: Any) -> bool:
    """An int that is not a bool: ``True`` is an int to Python, never a count to us."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_size(value: int | float | str) -> int:
    """Parse a byte count: an int, or a string like ``"50GB"`` (decimal) or ``"1GiB"`` (binary)."""
    if isinstance(value, bool):
        raise ValueError(
            f"invalid size {value!r}: expected bytes as an int or a string like '50GB'"
        )
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"invalid size {value!r}: expected a finite number of bytes")
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must not be negative")
        return int(value)
    match = _SIZE_RE.match(str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"invalid size {value!r}: expected bytes as an int or a string like '50GB' or '1GiB'"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def parse_max_member_size(value: int | str) -> int:
    """The ``max_member_size`` option as bytes (an int, or a size such as ``"1GiB"``)."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"max_member_size: {exc}") from None


def parse_bool(value: Any, name: str) -> bool:
    """Parse a boolean option that may come from an environment variable as a string."""
    if isinstance(value, bool):
        return value
    word = bool_word(str(value))
    if word is not None:
        return word
    raise ValueError(f"invalid value {value!r} for option {name!r}: expected true or false")


def parse_int(value: Any, name: str, minimum: int = 0) -> int:
    """Parse an integer option that may come from an environment variable as a string."""
    try:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"invalid value {value!r} for option {name!r}: expected an integer"
        ) from None
    if math.isnan(number) or number < minimum:  # (NaN compares false with any minimum)
        raise ValueError(f"invalid value {value!r} for option {name!r}: must be >= {minimum}")
    return number


def parse_float(value: Any, name: str, minimum: float = 0.0) -> float:
    """Parse a number option that may come from an environment variable as a string."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"invalid value {value!r} for option {name!r}: expected a number"
        ) from None
    if math.isnan(number) or number < minimum:  # (NaN compares false with any minimum)
        raise ValueError(f"invalid value {value!r} for option {name!r}: must be >= {minimum}")
    return number


def user_cache_dir() -> Path:
    """The per-user cache directory (XDG on Linux, ~/Library/Caches on macOS)."""
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif os.uname().sysname == "Darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fsspec-shards"


def verbose_cache() -> bool:
    """webdataset's ``WDS_VERBOSE_CACHE``: log every cache download at INFO on stderr."""
    return parse_bool(os.environ.get("WDS_VERBOSE_CACHE", "0"), "WDS_VERBOSE_CACHE")
