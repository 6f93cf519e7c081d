"""Which options a backend takes, so that a misspelt one is an error when the wds filesystem
is made, not a ``TypeError`` deep in a client at the first request (or never, when every
file is already cached).

A backend takes the named parameters of its ``__init__`` (and of its base classes' that it
hands ``**kwargs`` on to), fsspec's instance options, and for some backends a second set it
passes on (its ``Backend.passed_on()``: s3fs gives the rest to aiobotocore's
``AioSession``, fsspec's HTTP filesystem to every aiohttp request). Tables of a client's
keywords (its ``Backend.option_tables``: s3fs ``client_kwargs`` and ``config_kwargs``, HTTP
``client_kwargs``) are checked against what that client takes. Backends whose leftovers go
somewhere we cannot list (adlfs hands them to azure-identity's credential) and backends we
do not know pass on what cannot be listed (``passed_on()`` is None) and are not checked.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from typing import Any

import fsspec

from fsspec_shards.errors import OptionError
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.base import FSSPEC_INSTANCE_OPTIONS, parameters


def check_backend_options(protocol: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`OptionError` naming the first option of ``options`` that backend
    ``protocol`` does not take (with the closest one it does take, if any)."""
    accepted = accepted_options(protocol)
    if accepted is None:
        return
    _refuse_unknown(protocol, options, accepted)
    for table, takes in backend_for(protocol).option_tables.items():
        given = options.get(table)
        if isinstance(given, Mapping):
            _refuse_unknown(f"{protocol}.{table}", given, frozenset(takes()))


def _refuse_unknown(where: str, options: Mapping[str, Any], accepted: frozenset[str]) -> None:
    for name in sorted(set(options) - accepted):
        close = difflib.get_close_matches(name, sorted(accepted), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise OptionError(f"{where}.{name}", f"{where} does not take {name!r}{hint}")


@functools.lru_cache(maxsize=32)
def accepted_options(protocol: str) -> frozenset[str] | None:
    """Every option the filesystem of ``protocol`` takes, or None when it is not checked;
    from the backend's :attr:`~fsspec_shards.storage.backends.base.Backend.filesystem_options`
    where it lists them (no import of the class), else :func:`introspected_options`."""
    known = backend_for(protocol).filesystem_options
    if known is not None:
        return FSSPEC_INSTANCE_OPTIONS | known
    return introspected_options(protocol)


def introspected_options(protocol: str) -> frozenset[str] | None:
    """Every option the filesystem class of ``protocol`` takes, read from the class (imported
    here), or None when it is not checked."""
    try:
        extra = backend_for(protocol).passed_on()
        if extra is None:
            return None
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError:
        return None  # building the backend will say what is missing
    names = set(FSSPEC_INSTANCE_OPTIONS) | extra
    for klass in cls.__mro__:
        if klass is fsspec.AbstractFileSystem:
            break  # it keeps whatever it is given, and uses none of it
        if "__init__" in vars(klass):
            names |= parameters(klass.__init__)
    return frozenset(names)
