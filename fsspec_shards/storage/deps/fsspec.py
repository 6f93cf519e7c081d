"""fsspec beyond its public API.

Uses:

- ``AbstractFileSystem._strip_protocol(path)``: a URL or path as the backend's own path
  (what every fsspec method does to its argument first; there is no public spelling).
- ``AbstractFileSystem._strip_protocol`` as a function, for a stand-in class that names
  paths by fsspec's default rule (:func:`default_strip_protocol`).
- ``cls._get_kwargs_from_urls(url)``: the options a URL itself gives its filesystem (what
  ``fsspec.core.url_to_fs`` adds to each hop's).
- ``HTTPFileSystem._raise_not_found_for_status(response, url)``: the http backend's mapping
  of a response status to ``FileNotFoundError``/``ClientResponseError``, so our streaming
  GET fails as fsspec's own would.
"""

from __future__ import annotations

from typing import Any

import fsspec


def strip_protocol(fs: fsspec.AbstractFileSystem | type, path: str) -> str:
    """``path`` as backend ``fs`` (an instance or a class) names it, protocol removed."""
    return fs._strip_protocol(path)


def default_strip_protocol() -> classmethod:
    """fsspec's default ``_strip_protocol`` (``cls.protocol`` prefixes and trailing slashes
    removed, ``cls.root_marker`` for nothing), to put on a class of one's own."""
    return classmethod(fsspec.AbstractFileSystem._strip_protocol.__func__)


def kwargs_from_url(cls: type, url: str) -> dict[str, Any]:
    """The options ``url`` itself gives a filesystem of class ``cls`` (s3fs: ``versionId``
    in the query makes it version-aware), as ``fsspec.core.url_to_fs`` reads them."""
    return cls._get_kwargs_from_urls(url)


def raise_for_http_status(fs: fsspec.AbstractFileSystem, response: Any, url: str) -> None:
    """Raise what fsspec's http backend raises for a failed ``response`` to ``url``."""
    fs._raise_not_found_for_status(response, url)
