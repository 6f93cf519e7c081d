"""Where an S3 configuration's requests go (:func:`resolve`), for the cache key and the
obstore store alike.

Invariant: the cache key (``identity``) and the obstore store (``obstore_options``) take
the endpoint and the region from :func:`resolve`, which resolves them as botocore does
when s3fs makes its client, so a key names the endpoint the requests go to:

- endpoint: the ``endpoint_url`` option, else ``client_kwargs["endpoint_url"]``, else the
  configured one (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's ``services``
  section, the profile's ``endpoint_url`` in the config file) unless
  ``ignore_configured_endpoint_urls`` (``config_kwargs``, ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``
  or the config file) says to ignore it; else AWS itself.
- region: ``client_kwargs``/``config_kwargs`` ``region_name``, else the profile's
  (``AWS_DEFAULT_REGION``, the config file).
- profile: the ``profile`` option, else ``AWS_PROFILE``; a ``session`` given is asked itself.

Where no profile is named and botocore would find no config file, the environment alone
decides, and :func:`environment_location` answers without botocore (whose import was most
of the main process's cost of a cold first batch); else a botocore session answers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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


def resolve(options: Mapping[str, Any]) -> Location:
    """The location of the s3fs configuration ``options`` (s3fs's keyword arguments), in
    the environment and config files of now. Raises botocore's errors (an unknown profile,
    a services section that does not exist) as s3fs would at its first request."""
    return environment_location(options) or botocore_location(options)


CONFIG_FILES = (
    ("AWS_CONFIG_FILE", "~/.aws/config"),
    ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
)
"""botocore's config files: the variable naming each, and its default path (a profile
found in the credentials file is read as one of the config file's)."""


def environment_location(options: Mapping[str, Any]) -> Location | None:
    """The location of ``options`` where the environment alone decides it, as botocore
    resolves it, without importing botocore (0.07-0.12 s) nor making a session; None where
    botocore must be asked: a ``session`` or ``profile`` given, ``AWS_PROFILE`` or
    ``AWS_DEFAULT_PROFILE`` set, or a config file where botocore would read one. botocore
    reads an empty variable as set (``AWS_CONFIG_FILE=""`` names no file), expands
    variables then ``~`` in a file's path, and takes ``ignore_configured_endpoint_urls``
    as true only when it reads "true" (a test compares this with botocore's answers)."""
    if options.get("session") or options.get("profile") is not None:
        return None
    if "AWS_PROFILE" in os.environ or "AWS_DEFAULT_PROFILE" in os.environ:
        return None
    for variable, default in CONFIG_FILES:
        path = os.path.expanduser(os.path.expandvars(os.environ.get(variable, default)))
        if os.path.isfile(path):
            return None
    client_kwargs = options.get("client_kwargs") or {}
    config_kwargs = options.get("config_kwargs") or {}
    endpoint = options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    if not endpoint:
        ignore = config_kwargs.get("ignore_configured_endpoint_urls")
        if ignore is None:
            ignore = os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true"
        if not ignore:
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = (
        client_kwargs.get("region_name")
        or config_kwargs.get("region_name")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    return Location(endpoint or None, region or None, None)


def botocore_location(options: Mapping[str, Any]) -> Location:
    """The location of ``options`` as a botocore session of its profile resolves it."""
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
