"""gcsfs beyond its public API.

Uses:

- ``GCSFileSystem._location``: the endpoint the instance talks to (``endpoint_url`` or
  ``STORAGE_EMULATOR_HOST``; None for Google's), for the cache key; ``gcsfs.core._location()``:
  the one an instance without ``endpoint_url`` talks to (the emulator unless ``default``,
  else ``storage.<GOOGLE_CLOUD_UNIVERSE_DOMAIN>``), for the obstore store to go there too.
- ``GCSFileSystem._request.__wrapped__``: gcsfs binds its retries (6) into the decorator of
  ``_request`` at class definition and logs every give-up at ERROR with a traceback; the
  undecorated request is bound on our private instance instead, so a failure reaches our
  retry layer at once and quietly.
- ``GCSFileSystem._get_object(path)``: the object's metadata in one request (``info()``
  also lists the prefix).
- ``_set_session()``, ``session``, ``_get_headers(headers)``, ``_get_params(params)``: the
  authorised aiohttp session, headers and query parameters of a media download (the
  streaming GET; gcsfs's own reads buffer whole ranges).
"""

from __future__ import annotations

import types
from typing import Any

import fsspec


def endpoint(fs: fsspec.AbstractFileSystem) -> str | None:
    """The endpoint gcsfs instance ``fs`` talks to (None or Google's for Google's own)."""
    return getattr(fs, "_location", None)


def default_endpoint() -> str:
    """The endpoint a gcsfs instance without ``endpoint_url`` talks to, in this
    environment."""
    from gcsfs.core import _location

    return _location()


def request_without_retries(fs: Any) -> bool:
    """Bind gcsfs's undecorated ``_request`` on instance ``fs``; False if gcsfs no longer
    has one (its retries then stay on)."""
    request = getattr(type(fs)._request, "__wrapped__", None)
    if request is None:
        return False
    fs._request = types.MethodType(request, fs)
    return True


async def get_object(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any]:
    """``info()`` of the object at ``path`` alone (``FileNotFoundError`` if none)."""
    return await fs._get_object(path)


async def media_request(
    fs: fsspec.AbstractFileSystem, headers: dict[str, str]
) -> tuple[Any, dict[str, str], dict[str, str]]:
    """The authorised aiohttp session, ``headers`` with gcsfs's own (authorisation, user
    project) and gcsfs's query parameters, for a request of instance ``fs``."""
    await fs._set_session()
    return fs.session, fs._get_headers(headers), fs._get_params({})
