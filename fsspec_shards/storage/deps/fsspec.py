"""fsspec beyond its public API.

Uses:

- ``AbstractFileSystem._strip_protocol(path)``: a URL or path as the backend's own path
  (what every fsspec method does to its argument first; there is no public spelling).
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


def raise_for_http_status(fs: fsspec.AbstractFileSystem, response: Any, url: str) -> None:
    """Raise what fsspec's http backend raises for a failed ``response`` to ``url``."""
    fs._raise_not_found_for_status(response, url)
