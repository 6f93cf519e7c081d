"""S3 (s3fs; obstore's S3 store): where one configuration's objects live.

Invariant: the cache key (``identity``) and the obstore store (``obstore_options``) take
the endpoint and the region from :func:`location`, which resolves them as botocore does
when s3fs makes its client, so a key names the endpoint the requests go to:

- endpoint: the ``endpoint_url`` option, else ``client_kwargs["endpoint_url"]``, else the
  configured one (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's ``services``
  section, the profile's ``endpoint_url`` in the config file) unless
  ``ignore_configured_endpoint_urls`` (``config_kwargs``, ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``
  or the config file) says to ignore it; else AWS itself.
- region: ``client_kwargs``/``config_kwargs`` ``region_name``, else the profile's
  (``AWS_DEFAULT_REGION``, the config file).
- profile: the ``profile`` option, else ``AWS_PROFILE``; a ``session`` given is asked itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

PROTOCOLS = ("s3", "s3a")


@dataclass(frozen=True)
class Location:
    """Where an S3 configuration's requests go: ``endpoint`` None means AWS itself."""

    endpoint: str | None
    region: str | None
    profile: str | None

    def __str__(self) -> str:
        """The location as the cache key holds it."""
        if self.endpoint:
            return f"endpoint={self.endpoint}"
        return f"endpoint=aws;profile={self.profile or ''};region={self.region or ''}"


def location(options: Mapping[str, Any]) -> Location:
    """The location of the s3fs configuration ``options`` (s3fs's keyword arguments), in
    the environment and config files of now. Raises botocore's errors (an unknown profile,
    a services section that does not exist) as s3fs would at its first request."""
    from fsspec_shards.storage.deps import botocore as botocore_deps  # s3fs brings botocore

    client_kwargs = options.get("client_kwargs") or {}
    config_kwargs = options.get("config_kwargs") or {}
    session = options.get("session") or botocore_deps.session(options.get("profile"))
    endpoint = options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    if not endpoint:
        ignore = config_kwargs.get("ignore_configured_endpoint_urls")
        if ignore is None:
            ignore = session.get_config_variable("ignore_configured_endpoint_urls")
        if not ignore:
            endpoint = botocore_deps.configured_endpoint(session, "s3")
    region = (
        client_kwargs.get("region_name")
        or config_kwargs.get("region_name")
        or session.get_config_variable("region")
    )
    return Location(endpoint or None, region or None, session.profile)


_LOCATIONS: dict[int, Location] = {}


def location_of(fs: fsspec.AbstractFileSystem) -> Location:
    """The location of s3fs instance ``fs``, resolved once per instance (s3fs reads the
    environment and config files once too, when it makes its client)."""
    found = _LOCATIONS.get(id(fs))
    if found is None:
        found = location(
            {
                "endpoint_url": getattr(fs, "endpoint_url", None),
                "client_kwargs": getattr(fs, "client_kwargs", None),
                "config_kwargs": getattr(fs, "config_kwargs", None),
                "profile": (getattr(fs, "kwargs", None) or {}).get("profile"),
                "session": getattr(fs, "session", None),
            }
        )
        _LOCATIONS[id(fs)] = found
        weakref.finalize(fs, _LOCATIONS.pop, id(fs), None)
    return found
