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

from typing import Any

import botocore.exceptions
import botocore.session
from botocore.configprovider import ConfiguredEndpointProvider

Error = botocore.exceptions.BotoCoreError
"""What botocore raises for a profile or config file it cannot use."""


def session(profile: str | None) -> botocore.session.Session:
    """A botocore session of ``profile`` (None: ``AWS_PROFILE`` or the default), as s3fs
    makes one."""
    return botocore.session.Session(profile=profile)


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
