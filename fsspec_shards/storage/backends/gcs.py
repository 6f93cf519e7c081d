"""Google Cloud Storage (gcsfs; obstore's GCS store): everything the layer knows of it.

Where its objects live (the endpoint as gcsfs resolves it, for the cache key and the
obstore store alike: ``endpoint_url``, ``STORAGE_EMULATOR_HOST`` unless ``default``, else
Google's in ``GOOGLE_CLOUD_UNIVERSE_DOMAIN``), which ``info()`` fields name a version
(``generation``) and carry checksums (``md5Hash``, ``crc32c``), gcsfs's socket time-out,
the taming of its own retries, how its errors say their status, the one-request
``info()``, the streaming GET (:meth:`GcsBackend.open_range`), and the obstore mapping
(:data:`OBSTORE_TABLE` plus :func:`obstore_credentials`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import fsspec
from fsspec.asyn import sync

from fsspec_shards.redact import redact_text
from fsspec_shards.storage.backends import failure_names
from fsspec_shards.storage.backends.base import (
    IGNORED_COMMON,
    Backend,
    Options,
    StoreSpec,
    as_bool,
    http_endpoint,
    range_header,
    within,
)
from fsspec_shards.storage.backends.versions import VersionFields, facts_from_headers
from fsspec_shards.storage.deps import gcsfs as gcsfs_deps

GOOGLE = "https://storage.googleapis.com"
logger = logging.getLogger(__name__)


class GcsBackend(Backend):
    """gcsfs."""

    protocols = ("gs", "gcs")
    version_fields = VersionFields(
        etag=("etag",), version=("generation",), modified=("updated",), no_version=("", "0")
    )
    checksum_fields = (("md5", "md5Hash", 32), ("crc32c", "crc32c", 8))
    """``md5Hash`` is absent on composite objects."""
    remote = True
    errors = failure_names.GCS

    def location(self, fs: fsspec.AbstractFileSystem) -> str:
        """The endpoint gcsfs instance ``fs`` talks to."""
        return f"endpoint={gcsfs_deps.endpoint(fs) or GOOGLE}"

    def passed_on(self) -> set[str]:
        """Nothing: the backend takes its own parameters only."""
        return set()

    def socket_timeouts(self, fs: fsspec.AbstractFileSystem) -> list[Any]:
        """gcsfs's ``requests_timeout``."""
        return [getattr(fs, "requests_timeout", None)]

    def tame_instance(self, fs: fsspec.AbstractFileSystem) -> None:
        """gcsfs's requests without its retry decorator (see ``deps/gcsfs.py``; gcsfs takes
        no retry option)."""
        if not gcsfs_deps.request_without_retries(fs):
            logger.warning("gcsfs changed: cannot turn down its own retries")

    def file_info(
        self, fs: fsspec.AbstractFileSystem, path: str, timeout: float | None
    ) -> dict[str, Any]:
        """The object's metadata in one request (gcsfs's ``info`` also lists the prefix);
        when that finds no object, ``info`` says what is there (a directory, or nothing)."""
        if not fs.asynchronous:
            try:
                return sync(fs.loop, gcsfs_deps.get_object, fs, path, timeout=timeout)
            except FileNotFoundError:
                pass
        return super().file_info(fs, path, timeout)

    @contextlib.asynccontextmanager
    async def open_range(self, fs, path, start, end, expect, timeout) -> AsyncIterator:
        """The JSON API's media download, conditional on the generation expected."""
        from gcsfs.retry import validate_response

        session, headers, params = await gcsfs_deps.media_request(
            fs, {"Range": range_header(start, end)}
        )
        if expect is not None and expect.version and "generation=" not in fs.url(path):
            params["ifGenerationMatch"] = str(expect.version)
        response = await within(
            session.get(fs.url(path), headers=headers, params=params, timeout=fs.requests_timeout),
            timeout,
        )
        async with response:
            if response.status >= 400:
                validate_response(response.status, await response.read(), path)
            facts = facts_from_headers(response.status, response.headers, "x-goog-generation")
            yield facts, response.content.read

    def obstore_store(self, options: Options) -> StoreSpec:
        """The obstore GCS store (:func:`obstore_store`)."""
        return obstore_store(options)


# -- obstore ---------------------------------------------------------------------------

OBSTORE_IGNORED = IGNORED_COMMON | {
    "project",
    "access",
    "consistency",
    "cache_timeout",
    "secure_serialize",
    "check_connection",
    "requests_timeout",
    "default_location",
    "version_aware",
    "finalize_on_close",
    "mrd_pool_cache_size",
    "max_mrd_pool_cache_queue_size",
}
OBSTORE_TABLE = {
    "endpoint": ("endpoint_url",),
    "token": ("token",),
}
"""Where each setting of the GCS store comes from: the first source given wins."""


def obstore_store(options: Options) -> StoreSpec:
    """The obstore GCS store going where gcsfs would, with gcsfs's credentials."""
    given = {name: options.pick(*sources) for name, sources in OBSTORE_TABLE.items()}
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    endpoint = given["endpoint"]
    if not endpoint:  # where gcsfs goes: the emulator's, another universe's, Google's
        endpoint = gcsfs_deps.default_endpoint()
        endpoint = None if endpoint.rstrip("/") == GOOGLE else endpoint
    if endpoint:
        if "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        config["base_url"] = endpoint.rstrip("/")
        client.update(http_endpoint(endpoint))
    if as_bool(options, "requester_pays", options.take("requester_pays", False)):
        raise options.refused("requester_pays", "obstore's GCS store sends no billing project")
    if options.take("session_kwargs"):
        raise options.refused("session_kwargs", "aiohttp session settings cannot be carried over")
    credentials, secrets, how = obstore_credentials(options, given["token"], config)
    options.finish(OBSTORE_IGNORED)
    where = config.get("base_url", GOOGLE)
    shown = redact_text(f"gcs at {where} ({how})")
    return StoreSpec("gcs", config, client, credentials, tuple(s for s in secrets if s), shown)


def obstore_credentials(
    options: Options, token: Any, config: dict[str, Any]
) -> tuple[Any, list[str], str]:
    """The credential provider for gcsfs's ``token`` (a service account key goes into
    ``config``), the secrets to mask, and how it signs."""
    if token == "anon":
        config["skip_signature"] = True
        return None, [], "anonymous"
    if token is None or token == "google_default":
        return _google_credentials(options, None), [], "application default credentials"
    if token == "cloud":
        return _google_credentials(options, "cloud"), [], "instance metadata"
    if isinstance(token, str) and token in ("browser", "cache"):
        raise options.refused("token", f"gcsfs's {token!r} login has no obstore equivalent")
    if isinstance(token, str | os.PathLike | dict):
        info = _read_token(options, token)
        if info.get("type") == "service_account":
            config["service_account_key"] = json.dumps(info)
            return None, [str(info.get("private_key") or "")], "service account"
        secrets = [str(info.get(k) or "") for k in ("refresh_token", "client_secret")]
        return _google_credentials(options, info), secrets, "user credentials"
    if hasattr(token, "refresh") and hasattr(token, "token"):
        return _google_credentials(options, token), [], "google-auth credentials"
    raise options.refused("token", f"a {type(token).__name__} is not a gcsfs token")


def _read_token(options: Options, token: Any) -> dict[str, Any]:
    if isinstance(token, dict):
        return dict(token)
    try:
        with open(token, encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError) as exc:
        raise options.refused(
            "token", f"cannot read the credentials file ({type(exc).__name__})"
        ) from None
    if not isinstance(info, dict):
        raise options.refused("token", "the credentials file holds no JSON object")
    return info


def _google_credentials(options: Options, source: Any) -> Callable[[], Any]:
    """An obstore credential provider over google-auth credentials: ``None`` for application
    default credentials, ``"cloud"`` for the metadata server, an authorized-user dict, or a
    credentials object."""
    try:
        import google.auth
        import google.auth.exceptions
        from obstore.auth.google import GoogleCredentialProvider
    except ImportError:
        raise options.refused("token", "google-auth is not installed") from None
    try:
        if source is None:
            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/devstorage.full_control"]
            )
        elif source == "cloud":
            from google.auth import compute_engine

            credentials = compute_engine.Credentials()
        elif isinstance(source, dict):
            from google.oauth2.credentials import Credentials

            credentials = Credentials.from_authorized_user_info(source)
        else:
            credentials = source
    except (google.auth.exceptions.GoogleAuthError, ValueError) as exc:  # no ADC, bad file
        raise options.refused(
            "token", redact_text(f"google-auth: {type(exc).__name__}: {exc}")
        ) from None
    return GoogleCredentialProvider(credentials)
