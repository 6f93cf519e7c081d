"""botocore beyond its public API.

Uses:

- ``botocore.configprovider.ConfiguredEndpointProvider(full_config, scoped_config,
  client_name).provide()``: the endpoint ``Session.create_client`` takes when none is given
  (``AWS_ENDPOINT_URL_<SERVICE>``, ``AWS_ENDPOINT_URL``, the profile's ``services`` section,
  the profile's ``endpoint_url``). botocore marks the class private; we need the endpoint a
  client *would* use without building one (building one resolves credentials, which may
  ask the instance metadata service).

The rest is public: ``Session(profile=...)``, ``full_config``, ``get_scoped_config()``,
``get_config_variable("region" | "ignore_configured_endpoint_urls")``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import botocore.exceptions
import botocore.session
from botocore.configprovider import ConfiguredEndpointProvider

Error = botocore.exceptions.BotoCoreError
"""What botocore raises for a profile or config file it cannot use."""


_SESSIONS: dict[tuple, botocore.session.Session] = {}
_KEPT_SESSIONS = 16
"""Sessions kept at most (each state of the environment and files makes one)."""


def session(profile: str | None) -> botocore.session.Session:
    """A botocore session of ``profile`` (None: ``AWS_PROFILE`` or the default), as s3fs
    makes one. Kept per process for what a session reads (:func:`_what_sessions_read`):
    making one registers ~120 handlers (30-160 ms), which each DataLoader worker paid
    twice; one made before the fork is inherited, and a changed ``AWS_*`` variable or
    config file gets a new one, as a new session would see it."""
    key = (profile, _what_sessions_read())
    found = _SESSIONS.get(key)
    if found is None:
        found = botocore.session.Session(profile=profile)
        if len(_SESSIONS) >= _KEPT_SESSIONS:
            _SESSIONS.clear()
        _SESSIONS[key] = found
    return found


def _what_sessions_read() -> tuple:
    """The ``AWS_*`` environment variables, and the path and a digest of the content of
    the config and credentials files: what a botocore session's answers depend on (it reads
    the files once, on first use). Reading two small files takes microseconds."""
    environment = tuple(sorted(item for item in os.environ.items() if item[0].startswith("AWS_")))
    files = []
    for variable, default in (
        ("AWS_CONFIG_FILE", "~/.aws/config"),
        ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
    ):
        path = os.path.expanduser(os.environ.get(variable) or default)
        try:
            with open(path, "rb") as file:
                files.append((path, hashlib.sha256(file.read()).hexdigest()))
        except OSError:
            files.append((path, None))
    return environment, tuple(files)


def configured_endpoint(session: Any, service: str) -> str | None:
    """The endpoint configured for ``service`` in the environment or the config file of
    ``session``'s profile, as ``create_client`` finds it (whether to ignore it is the
    caller's: ``ignore_configured_endpoint_urls``)."""
    provider = ConfiguredEndpointProvider(
        full_config=session.full_config,
        scoped_config=session.get_scoped_config(),
        client_name=service,
    )
    return provider.provide() or None
