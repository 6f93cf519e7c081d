"""Which options a backend takes, so that a misspelt one is an error when the wds filesystem
is made, not a ``TypeError`` deep in a client at the first request (or never, when every
file is already cached).

A backend takes the named parameters of its ``__init__`` (and of its base classes' that it
hands ``**kwargs`` on to), fsspec's instance options, and for some backends a second set it
passes on: s3fs gives the rest to aiobotocore's ``AioSession``, fsspec's HTTP filesystem to
every aiohttp request. Tables of a client's keywords (s3fs ``client_kwargs`` and
``config_kwargs``, HTTP ``client_kwargs``) are checked against what that client takes.
Backends whose leftovers go somewhere we cannot list (adlfs hands them to azure-identity's
credential) and backends we do not know are not checked.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import fsspec

from fsspec_shards.errors import OptionError
from fsspec_shards.storage.backends import FSSPEC_INSTANCE_OPTIONS, gcs, http, local, s3


def _aiobotocore_session() -> set[str]:
    from aiobotocore.session import AioSession

    return _parameters(AioSession.__init__)


def _aiohttp_request() -> set[str]:
    import aiohttp

    return _parameters(aiohttp.ClientSession._request) - {"method", "str_or_url"}


def _botocore_client() -> set[str]:
    from botocore.session import Session

    return _parameters(Session.create_client) - {"service_name"}


def _botocore_config() -> set[str]:
    from botocore.config import Config

    return set(Config.OPTION_DEFAULTS)


def _aiohttp_session() -> set[str]:
    import aiohttp

    return _parameters(aiohttp.ClientSession.__init__)


def _nothing() -> set[str]:
    return set()


_PASSED_ON: dict[str, Callable[[], set[str]]] = {
    **dict.fromkeys(s3.PROTOCOLS, _aiobotocore_session),
    **dict.fromkeys(http.PROTOCOLS, _aiohttp_request),
    **dict.fromkeys(gcs.PROTOCOLS, _nothing),
    **dict.fromkeys(local.PROTOCOLS, _nothing),
}
"""Per checked protocol: the options its filesystem passes on beyond its own parameters."""

_TABLES: dict[str, dict[str, Callable[[], set[str]]]] = {
    **dict.fromkeys(
        s3.PROTOCOLS, {"client_kwargs": _botocore_client, "config_kwargs": _botocore_config}
    ),
    **dict.fromkeys(http.PROTOCOLS, {"client_kwargs": _aiohttp_session}),
}
"""Per protocol: its options that are tables of a client's keywords, and what those take."""


def check_backend_options(protocol: str, options: Mapping[str, Any]) -> None:
    """Raise :class:`OptionError` naming the first option of ``options`` that backend
    ``protocol`` does not take (with the closest one it does take, if any)."""
    accepted = accepted_options(protocol)
    if accepted is None:
        return
    _refuse_unknown(protocol, options, accepted)
    for table, takes in _TABLES.get(protocol, {}).items():
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
    """Every option the filesystem of ``protocol`` takes, or None when it is not checked."""
    passed_on = _PASSED_ON.get(protocol)
    if passed_on is None:
        return None
    try:
        cls = fsspec.get_filesystem_class(protocol)
        extra = passed_on()
    except ImportError:
        return None  # building the backend will say what is missing
    names = set(FSSPEC_INSTANCE_OPTIONS) | extra
    for klass in cls.__mro__:
        if klass is fsspec.AbstractFileSystem:
            break  # it keeps whatever it is given, and uses none of it
        if "__init__" in vars(klass):
            names |= _parameters(klass.__init__)
    return frozenset(names)


def _parameters(function: Callable) -> set[str]:
    """The named parameters of ``function`` (not ``self``, ``*args`` or ``**kwargs``)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds and name != "self"
    }
