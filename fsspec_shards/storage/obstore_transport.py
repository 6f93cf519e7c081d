"""The fast download transport: ranged streaming GETs through obstore (Rust ``object_store``).

The user configures a backend with fsspec options (s3fs, gcsfs, adlfs, fsspec's http).
:func:`map_options` turns those options into an obstore store configuration, or says which
option it cannot carry over and why; :func:`choose_transport` applies the user's
``transport="auto" | "obstore" | "fsspec"`` to that answer. :class:`ObstoreTransport` then
serves what the download layer needs: :meth:`~ObstoreTransport.stream` (a ranged GET whose
body is handed to a sink as it arrives) and :meth:`~ObstoreTransport.info` (size and
version of an object).

Invariants:

- The store goes where the fsspec backend would go, with the same credentials: every
  setting that decides the endpoint, the account and the signing is set explicitly, so that
  obstore's own reading of environment variables (``AWS_ENDPOINT``, ``AZURE_STORAGE_*``,
  ...) cannot send requests elsewhere. An option that cannot be carried over exactly is
  refused, never dropped: ``auto`` then uses the fsspec backend, ``obstore`` raises a
  ``ValueError`` naming the option.
- Retries are ours: stores are built with obstore's retries off, so that every failure
  reaches the retry layer (``retry.py``) once, classified: 404 -> ``FileNotFoundError``,
  401/403 -> ``PermissionError``, 412 or a response of another version ->
  ``versions.VersionMismatch``, 5xx/408/429 -> an ``OSError`` carrying ``.status``, cuts and
  resets -> ``ConnectionError``, no progress within the time-out -> ``TimeoutError``.
- One set of types with the fsspec transports (``streams.py``): ``expect`` is a
  ``versions.Version``, the answer ``versions.Facts``, and every response passes
  ``versions.check_response`` before a byte of it reaches the sink.
- Bytes reach the sink as they arrive (the GIL is released while Rust waits for them); a
  transfer that breaks off has handed over every byte received before the break, all of
  them correct data from ``start`` on. The time-out bounds each wait for the server (the
  connection, the headers, every read of the body), not the whole transfer.
- No message or exception chain shows a secret: errors are rebuilt from redacted text
  (``fsspec_shards.redact``) with the configured keys and tokens masked, and raised without
  a chain.
- obstore's runtime does not survive ``fork()``: a process forked after this module made its
  first request cannot use obstore at all (every call would hang). Such a child gets
  :class:`TransportUnavailable` at once (``auto`` falls back to fsspec there); stores are
  cached per process and the cache is emptied in a forked child. A response never outlives
  the call that asked for it, failed or not (no traceback keeps it): dropped in a forked
  child, it could wait forever for the parent's runtime threads.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

from fsspec_shards.redact import REDACTED, redact_text, redact_url
from fsspec_shards.storage.backends import (
    AZURE_PROTOCOLS,
    GCS_PROTOCOLS,
    HTTP_PROTOCOLS,
    S3_PROTOCOLS,
)
from fsspec_shards.storage.retry import TransientError
from fsspec_shards.storage.versions import Facts, Version, VersionMismatch, check_response

logger = logging.getLogger("fsspec_shards.storage.obstore_transport")

TRANSPORTS = ("auto", "obstore", "fsspec")
Sink = Callable[[bytes], None]

_NO_OVERALL_LIMIT = timedelta(days=7)
"""obstore's whole-request time-out (30 s by default) would cut a long download that is
moving; only the no-progress time-out applies, so the whole request gets a week."""

# Options that do not change which bytes a GET returns or how it is authorised: caching,
# listing, upload and client-pool settings of the fsspec backends, and their own time-outs
# and retries (the transport applies ours).
_IGNORED_COMMON = frozenset(
    {
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "asynchronous",
        "loop",
        "default_block_size",
        "block_size",
        "blocksize",
        "default_fill_cache",
        "default_cache_type",
        "cache_type",
        "cache_options",
        "max_concurrency",
        "timeout",
    }
)
_IGNORED = {
    "s3": _IGNORED_COMMON
    | {"fixed_upload_size", "cache_regions", "local_expiry_check", "version_aware"},
    "gcs": _IGNORED_COMMON
    | {
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
    },
    "azure": _IGNORED_COMMON
    | {
        "socket_timeout",
        "connection_timeout",
        "read_timeout",
        "assume_container_exists",
        "version_aware",
    },
    "http": _IGNORED_COMMON
    | {"simple_links", "same_scheme", "size_policy", "encoded", "trust_env"},
}
_S3_IGNORED_CONFIG = frozenset(
    {
        "retries",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "user_agent",
        "user_agent_extra",
        "user_agent_appid",
        "tcp_keepalive",
        "parameter_validation",
        "request_checksum_calculation",
        "response_checksum_validation",
    }
)
# s3_additional_kwargs that only apply to writes (the transport only reads)
_S3_WRITE_ONLY = frozenset(
    {"ServerSideEncryption", "SSEKMSKeyId", "ACL", "StorageClass", "ContentType", "Metadata"}
)
_HTTP_IGNORED_CLIENT = frozenset({"timeout", "trust_env", "headers", "auth"})
_STATUS_RE = re.compile(r"status code: (\d{3})")
_KIND_RE = re.compile(r"kind: (\w+)")
_OTHER_RANGE_RE = re.compile(r"Requested (\d+)\.\.(\d+), got (\d+)\.\.(\d+)")


# --------------------------------------------------------------------------- mapping


@dataclass(frozen=True)
class Unmappable:
    """Why obstore cannot serve a backend configuration: the option and the reason."""

    option: str
    reason: str

    def __str__(self) -> str:
        return f"option {self.option!r}: {self.reason}"


@dataclass(frozen=True, eq=False)
class StoreSpec:
    """How to build obstore stores for one backend configuration.

    ``config`` and ``client`` may hold secrets (never display them); ``secrets`` lists the
    values to mask in any text; ``shown`` describes the store for logs without them.
    """

    kind: str  # "s3" | "gcs" | "azure" | "http"
    config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    client: Mapping[str, Any] = field(default_factory=dict, repr=False)
    credentials: Callable[[], Any] | None = field(default=None, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    shown: str = ""
    bucket_region: bool = False  # AWS with no region known: ask the bucket for its region

    @property
    def key(self) -> str:
        """A digest naming this configuration (for the store cache; shows no secret): equal
        options give equal keys, so transports made from them share stores."""
        provider = getattr(self.credentials, "cache_key", None) or id(self.credentials)
        text = repr((self.kind, sorted(self.config.items()), sorted(self.client.items()), provider))
        return hashlib.sha256(text.encode()).hexdigest()


class _Refused(Exception):
    def __init__(self, option: str, reason: str) -> None:
        super().__init__(option, reason)
        self.option = option
        self.reason = reason


class _Options:
    """The user's options, consumed one by one; what is left at the end was not mapped."""

    def __init__(self, options: Mapping[str, Any], prefix: str = "") -> None:
        if not isinstance(options, Mapping):
            raise _Refused(prefix.rstrip(".") or "options", "is not a mapping")
        self._left = dict(options)
        self._prefix = prefix

    def name(self, key: str) -> str:
        return self._prefix + key

    def take(self, key: str, default: Any = None) -> Any:
        value = self._left.pop(key, None)
        return default if value is None else value

    def nested(self, key: str) -> _Options:
        return _Options(self.take(key, {}), self.name(key) + ".")

    def remaining(self) -> list[str]:
        """The names not taken yet."""
        return sorted(self._left)

    def refused(self, key: str, reason: str) -> _Refused:
        """The refusal of option ``key`` (to raise)."""
        return _Refused(self.name(key), reason)

    def finish(self, ignored: frozenset[str] = frozenset()) -> None:
        for key in self.remaining():
            if key not in ignored:
                raise self.refused(key, "has no obstore equivalent")


def _as_bool(options: _Options, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise options.refused(key, f"expected a boolean, got a {type(value).__name__}")


def _tls(options: _Options, key: str, verify: Any) -> dict[str, Any]:
    """Client options for a ``verify`` setting: a CA bundle file, ``False``, or ``True``."""
    if verify is None or verify is True:
        return {}
    if verify is False:
        return {"allow_invalid_certificates": True}
    if isinstance(verify, str | os.PathLike):
        try:
            with open(verify, "rb") as handle:
                return {"root_certificate": handle.read()}
        except OSError as exc:
            raise options.refused(key, f"cannot read the CA bundle ({exc.strerror})") from None
    raise options.refused(key, f"a {type(verify).__name__} is not a CA bundle path or a boolean")


def _http_endpoint(url: str) -> dict[str, Any]:
    return {"allow_http": True} if url.lower().startswith("http://") else {}


def map_options(protocol: str, options: Mapping[str, Any] | None = None) -> StoreSpec | Unmappable:
    """The obstore store for a backend given by fsspec ``protocol`` and its ``options``, or
    why there is none (the first option that cannot be carried over exactly)."""
    mapper = _MAPPERS.get(protocol)
    if mapper is None:
        return Unmappable("target_protocol", f"obstore has no store for protocol {protocol!r}")
    try:
        return mapper(_Options(options or {}))
    except _Refused as refusal:
        return Unmappable(refusal.option, refusal.reason)


def _map_s3(options: _Options) -> StoreSpec:
    client_kwargs = options.nested("client_kwargs")
    config_kwargs = options.nested("config_kwargs")
    extra = options.nested("s3_additional_kwargs")
    secrets: list[str] = []
    config: dict[str, Any] = {"virtual_hosted_style_request": False, "request_payer": False}
    client: dict[str, Any] = {}

    endpoint = options.take("endpoint_url") or client_kwargs.take("endpoint_url")
    if not endpoint and os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() not in (
        "true",
        "1",
    ):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    use_ssl = _as_bool(options, "use_ssl", options.take("use_ssl", True))
    if not use_ssl and not endpoint:
        raise options.refused("use_ssl", "plain-HTTP AWS endpoints are not supported")
    client.update(_tls(client_kwargs, "verify", client_kwargs.take("verify")))
    region = (
        client_kwargs.take("region_name")
        or config_kwargs.take("region_name")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )

    signature = config_kwargs.take("signature_version")
    anon = _as_bool(options, "anon", options.take("anon", False))
    if signature is not None:
        if str(signature).upper() == "UNSIGNED":
            anon = True
        elif signature not in ("s3v4", "v4"):
            raise config_kwargs.refused("signature_version", f"{signature!r} is not SigV4")
    addressing = config_kwargs.nested("s3")
    style = addressing.take("addressing_style", "auto")
    if style == "virtual":
        if endpoint:
            raise addressing.refused(
                "addressing_style", "virtual-host addressing with a custom endpoint"
            )
        config["virtual_hosted_style_request"] = True
    elif style not in ("auto", "path"):
        raise addressing.refused("addressing_style", f"unknown style {style!r}")
    addressing.finish()
    config_kwargs.finish(_S3_IGNORED_CONFIG)

    payer = extra.take("RequestPayer")
    if payer is not None:
        if str(payer).lower() != "requester":
            raise extra.refused("RequestPayer", f"unknown value {payer!r}")
        config["request_payer"] = True
    for name in extra.remaining():
        if name.startswith("SSECustomer"):
            raise extra.refused(name, "customer-provided encryption keys are not supported")
    extra.finish(_S3_WRITE_ONLY)
    if _as_bool(options, "requester_pays", options.take("requester_pays", False)):
        config["request_payer"] = True

    key = options.take("key") or options.take("username") or client_kwargs.take("aws_access_key_id")
    secret = (
        options.take("secret")
        or options.take("password")
        or client_kwargs.take("aws_secret_access_key")
    )
    token = options.take("token") or client_kwargs.take("aws_session_token")
    profile = options.take("profile")
    if options.take("session") is not None:
        raise options.refused("session", "a botocore session object cannot be carried over")
    client_kwargs.finish()

    credentials = None
    how = "anonymous"
    if anon:
        config["skip_signature"] = True
    elif key or secret:
        if not (key and secret):
            raise options.refused(
                "key" if not key else "secret", "an access key needs both key and secret"
            )
        secrets += [secret] + ([token] if token else [])
        credentials = _StaticCredentials(
            {"access_key_id": key, "secret_access_key": secret, "token": token, "expires_at": None}
        )
        config["skip_signature"] = False
        how = "access key"
    else:
        credentials, found_region = _botocore_credentials(options, profile)
        region = region or found_region
        config["skip_signature"] = False
        how = f"profile {profile}" if profile else "default credential chain"

    bucket_region = False
    if endpoint:
        config["endpoint"] = endpoint
        client.update(_http_endpoint(endpoint))
        config["region"] = region or "us-east-1"
    elif region:
        config["region"] = region
        config["endpoint"] = f"https://s3.{region}.amazonaws.com"
    else:
        bucket_region = True
    options.finish(_IGNORED["s3"])
    where = endpoint or (f"AWS {region}" if region else "AWS (region from the bucket)")
    return StoreSpec(
        "s3",
        config,
        client,
        credentials,
        tuple(secrets),
        redact_text(f"s3 at {where} ({how})"),
        bucket_region,
    )


class _StaticCredentials:
    """An obstore credential provider that hands out the credentials the user gave."""

    def __init__(self, credential: dict[str, Any]) -> None:
        self._credential = credential
        self.cache_key = hashlib.sha256(repr(sorted(credential.items())).encode()).hexdigest()

    def __call__(self) -> dict[str, Any]:
        return dict(self._credential)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({REDACTED})"


class _BotocoreCredentials:
    """An obstore credential provider over botocore's credential chain (environment, shared
    config and credential files, profiles, SSO, container and instance metadata): what s3fs
    uses when no key is given. Refreshable credentials are re-read when obstore asks."""

    TTL = timedelta(minutes=5)

    def __init__(self, credentials: Any, profile: str | None) -> None:
        self._credentials = credentials
        self.cache_key = f"botocore profile={profile}"

    def __call__(self) -> dict[str, Any]:
        frozen = self._credentials.get_frozen_credentials()
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(timezone.utc) + self.TTL,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({REDACTED})"


def _botocore_credentials(options: _Options, profile: str | None) -> tuple[Any, str | None]:
    try:
        import botocore.session
    except ImportError:
        raise options.refused(
            "key", "no key given and botocore is not installed to find credentials"
        ) from None
    try:
        session = botocore.session.Session(profile=profile)
        credentials = session.get_credentials()
        region = session.get_config_variable("region")
    except Exception as exc:  # botocore: ProfileNotFound, config parse errors
        raise options.refused(
            "profile" if profile else "key", redact_text(f"botocore: {exc}")
        ) from None
    if credentials is None:
        raise options.refused(
            "profile" if profile else "key",
            "no key given and botocore's credential chain found none",
        )
    return _BotocoreCredentials(credentials, profile), region


def _map_gcs(options: _Options) -> StoreSpec:
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    secrets: list[str] = []
    credentials = None
    endpoint = options.take("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if endpoint:
        if "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        config["base_url"] = endpoint.rstrip("/")
        client.update(_http_endpoint(endpoint))
    if _as_bool(options, "requester_pays", options.take("requester_pays", False)):
        raise options.refused("requester_pays", "obstore's GCS store sends no billing project")
    if options.take("session_kwargs"):
        raise options.refused("session_kwargs", "aiohttp session settings cannot be carried over")

    token = options.take("token")
    how = "anonymous"
    if token == "anon":
        config["skip_signature"] = True
    elif token is None or token == "google_default":
        credentials = _google_credentials(options, None)
        how = "application default credentials"
    elif token == "cloud":
        credentials = _google_credentials(options, "cloud")
        how = "instance metadata"
    elif isinstance(token, str) and token in ("browser", "cache"):
        raise options.refused("token", f"gcsfs's {token!r} login has no obstore equivalent")
    elif isinstance(token, str | os.PathLike | dict):
        info = _read_token(options, token)
        if info.get("type") == "service_account":
            config["service_account_key"] = json.dumps(info)
            secrets.append(str(info.get("private_key") or ""))
            how = "service account"
        else:
            credentials = _google_credentials(options, info)
            secrets += [str(info.get(k) or "") for k in ("refresh_token", "client_secret")]
            how = "user credentials"
    elif hasattr(token, "refresh") and hasattr(token, "token"):
        credentials = _google_credentials(options, token)
        how = "google-auth credentials"
    else:
        raise options.refused("token", f"a {type(token).__name__} is not a gcsfs token")
    options.finish(_IGNORED["gcs"])
    where = config.get("base_url", "https://storage.googleapis.com")
    return StoreSpec(
        "gcs",
        config,
        client,
        credentials,
        tuple(s for s in secrets if s),
        redact_text(f"gcs at {where} ({how})"),
    )


def _read_token(options: _Options, token: Any) -> dict[str, Any]:
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


def _google_credentials(options: _Options, source: Any) -> Callable[[], Any]:
    """An obstore credential provider over google-auth credentials: ``None`` for application
    default credentials, ``"cloud"`` for the metadata server, an authorized-user dict, or a
    credentials object."""
    try:
        import google.auth
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
    except Exception as exc:  # google.auth: DefaultCredentialsError, malformed files
        raise options.refused(
            "token", redact_text(f"google-auth: {type(exc).__name__}: {exc}")
        ) from None
    return GoogleCredentialProvider(credentials)


def _connection_fields(options: _Options, text: str) -> dict[str, str]:
    fields = {}
    for item in str(text).split(";"):
        name, sep, value = item.strip().partition("=")
        if not name:
            continue
        if not sep:
            raise options.refused("connection_string", "is not a list of name=value pairs")
        fields[name.strip().lower()] = value.strip()
    return fields


# Azurite's published development account (not a secret), as UseDevelopmentStorage names it.
_AZURITE_ACCOUNT = "devstoreaccount1"
_AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _map_azure(options: _Options) -> StoreSpec:
    env = os.environ.get
    connection_string = options.take("connection_string") or env("AZURE_STORAGE_CONNECTION_STRING")
    account = options.take("account_name") or env("AZURE_STORAGE_ACCOUNT_NAME")
    key = options.take("account_key") or env("AZURE_STORAGE_ACCOUNT_KEY")
    sas = options.take("sas_token") or env("AZURE_STORAGE_SAS_TOKEN")
    client_id = options.take("client_id") or env("AZURE_STORAGE_CLIENT_ID")
    client_secret = options.take("client_secret") or env("AZURE_STORAGE_CLIENT_SECRET")
    tenant_id = options.take("tenant_id") or env("AZURE_STORAGE_TENANT_ID")
    credential = options.take("credential")
    account_host = options.take("account_host")
    anon = options.take("anon")
    if anon is None:
        anon = env("AZURE_STORAGE_ANON", "false").lower() not in ("false", "0", "f", "")
    anon = _as_bool(options, "anon", anon)
    mode = options.take("location_mode", "primary")
    if mode != "primary":
        raise options.refused("location_mode", "only the primary location is supported")
    if options.take("request_session") is not None:
        raise options.refused("request_session", "a custom HTTP session cannot be carried over")
    endpoint = None
    secrets: list[str] = []

    if connection_string:
        fields = _connection_fields(options, connection_string)
        secrets += [connection_string]
        if fields.get("usedevelopmentstorage", "").lower() == "true":
            account, key = _AZURITE_ACCOUNT, _AZURITE_KEY
            endpoint = f"http://127.0.0.1:10000/{_AZURITE_ACCOUNT}"
        else:
            account = fields.get("accountname") or account
            key = fields.get("accountkey")
            sas = fields.get("sharedaccesssignature")
            endpoint = fields.get("blobendpoint")
        if not endpoint:
            if not account:
                raise options.refused(
                    "connection_string", "names neither an account nor a BlobEndpoint"
                )
            scheme = fields.get("defaultendpointsprotocol", "https")
            suffix = fields.get("endpointsuffix", "core.windows.net")
            endpoint = f"{scheme}://{account}.blob.{suffix}"
        if not account:
            account = urlsplit(endpoint).hostname.split(".")[0]
        if not (key or sas):
            anon = True
    elif not account:
        raise options.refused(
            "account_name", "neither a connection string nor an account name given"
        )
    if endpoint is None:
        endpoint = f"https://{account_host}" if account_host else None
        endpoint = endpoint or f"https://{account}.blob.core.windows.net"

    config: dict[str, Any] = {
        "account_name": account,
        "endpoint": endpoint.rstrip("/"),
        "use_emulator": False,
        "use_fabric_endpoint": False,
    }
    if isinstance(credential, str) and not key:
        key, credential = credential, None
    if credential is not None:
        raise options.refused("credential", f"a {type(credential).__name__} cannot be carried over")
    if key:
        config.update(access_key=key, credential_type="access_key", skip_signature=False)
        secrets.append(key)
        how = "account key"
    elif sas:
        sas = sas.lstrip("?")
        config.update(sas_key=sas, credential_type="sas_token", skip_signature=False)
        secrets.append(sas)
        how = "SAS token"
    elif client_id and client_secret and tenant_id:
        config.update(
            client_id=client_id,
            client_secret=client_secret,
            tenant_id=tenant_id,
            credential_type="client_secret",
            skip_signature=False,
        )
        secrets.append(client_secret)
        how = "service principal"
    elif anon:
        config["skip_signature"] = True
        how = "anonymous"
    else:
        raise options.refused(
            "account_name",
            "no key, SAS or service principal given: adlfs would use DefaultAzureCredential",
        )
    options.finish(_IGNORED["azure"])
    return StoreSpec(
        "azure",
        config,
        _http_endpoint(endpoint),
        None,
        tuple(s for s in secrets if s),
        redact_text(f"azure account {account} at {endpoint.split('?')[0]} ({how})"),
    )


def _map_http(options: _Options) -> StoreSpec:
    client_kwargs = options.nested("client_kwargs")
    headers = dict(options.take("headers") or {})
    headers.update(client_kwargs.take("headers") or {})
    secrets: list[str] = []
    auth = client_kwargs.take("auth")
    if auth is not None:
        login, password = getattr(auth, "login", None), getattr(auth, "password", None)
        if login is None:
            raise client_kwargs.refused("auth", f"a {type(auth).__name__} is not aiohttp.BasicAuth")
        encoded = base64.b64encode(f"{login}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {encoded}"
        secrets += [encoded, str(password or "")]
    secrets += [str(v) for k, v in headers.items() if k.lower() in ("authorization", "cookie")]
    client: dict[str, Any] = {}
    if headers:
        client["default_headers"] = {str(k): str(v) for k, v in headers.items()}
    ssl = options.take("ssl")
    if ssl is not None:
        if ssl is not False:
            raise options.refused(
                "ssl", "only ssl=False (no certificate check) can be carried over"
            )
        client["allow_invalid_certificates"] = True
    if options.take("get_client") is not None:
        raise options.refused(
            "get_client", "a custom aiohttp client factory cannot be carried over"
        )
    client_kwargs.finish(_HTTP_IGNORED_CLIENT)
    options.finish(_IGNORED["http"])
    return StoreSpec("http", {}, client, None, tuple(s for s in secrets if s), "http(s) server")


_MAPPERS: dict[str, Callable[[_Options], StoreSpec]] = {
    **dict.fromkeys(S3_PROTOCOLS, _map_s3),
    **dict.fromkeys(GCS_PROTOCOLS, _map_gcs),
    **dict.fromkeys(AZURE_PROTOCOLS, _map_azure),
    **dict.fromkeys(HTTP_PROTOCOLS, _map_http),
}


# --------------------------------------------------------------------------- availability


_runtime_pid: int | None = None
"""The process whose requests started obstore's runtime (it cannot be used after fork)."""


def unavailable_reason() -> str | None:
    """Why obstore cannot be used in this process, or None when it can."""
    try:
        import obstore  # noqa: F401
    except ImportError:
        return "obstore is not installed (pip install 'fsspec-shards[fast]')"
    if _runtime_pid is not None and _runtime_pid != os.getpid():
        return (
            "this process was forked from one that had used obstore, whose runtime does not "
            "survive fork() (start worker processes with 'spawn' or 'forkserver')"
        )
    return None


def choose_transport(
    protocol: str, options: Mapping[str, Any] | None, transport: str = "auto"
) -> ObstoreTransport | None:
    """The obstore transport for a backend, or None where the fsspec backend should serve.

    ``transport="obstore"`` raises ``ValueError`` naming the option (or the reason) when
    obstore cannot serve the backend; ``"auto"`` answers None then and logs why at DEBUG;
    ``"fsspec"`` always answers None.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    if transport == "fsspec":
        return None
    reason: str | None = unavailable_reason()
    spec = None
    if reason is None:
        mapped = map_options(protocol, options)
        if isinstance(mapped, Unmappable):
            reason = str(mapped)
        else:
            spec = mapped
    if spec is None:
        if transport == "obstore":
            raise ValueError(f"transport='obstore' cannot serve {protocol!r}: {reason}")
        logger.debug("transport 'auto' uses the fsspec backend for %r: %s", protocol, reason)
        return None
    return ObstoreTransport(protocol, spec)


class DownloadTransport:
    """The transport of one filesystem's downloads: obstore where it serves, else the fsspec
    backend's transport (``fallback``, any ``streams.Transport``).

    With ``required`` (``transport="obstore"``) whatever obstore cannot serve raises
    :class:`TransportUnavailable` naming why. Otherwise a path obstore cannot address goes
    to ``fallback``, and a server obstore cannot read (:class:`ServerUnsupported`, raised
    before any byte is passed) sends this and every later download to ``fallback``: the
    switch is logged once at DEBUG.
    """

    def __init__(self, fast: ObstoreTransport, fallback: Any, required: bool = False) -> None:
        self.fast = fast
        self.fallback = fallback
        self.required = required
        self.unserved: str | None = None  # why obstore stopped serving this backend

    def __repr__(self) -> str:
        using = "obstore" if self.unserved is None else "fsspec"
        return f"DownloadTransport({self.fast.spec.shown}, using {using})"

    @property
    def streaming(self) -> bool:
        """Whether bytes reach the sink as they arrive (see ``streams.Transport``)."""
        return self.unserved is None or getattr(self.fallback, "streaming", False)

    def stream(
        self,
        path: str,
        start: int,
        end: int | None,
        sink: Sink,
        timeout: float | None,
        rest_of_body: bool = False,
        expect: Version | None = None,
    ) -> Facts:
        """As ``streams.Transport.stream``, through obstore where it serves."""
        reason = self.unserved or self.fast.unserved_reason(path)
        if reason is None:
            try:
                return self.fast.stream(path, start, end, sink, timeout, rest_of_body, expect)
            except TransportUnavailable as exc:
                if self.required:
                    raise
                reason = str(exc)
                self.unserved = reason
            logger.debug("transport 'auto' uses the fsspec backend from now on: %s", reason)
        elif self.required:
            raise TransportUnavailable(
                errno.ENOTSUP, f"transport='obstore' cannot read {redact_url(path)}: {reason}"
            )
        return self.fallback.stream(path, start, end, sink, timeout, rest_of_body, expect)


def download_transport(
    protocol: str, options: Mapping[str, Any] | None, transport: str, fallback: Any
) -> Any:
    """The transport downloads of a backend use: a :class:`DownloadTransport` when obstore
    can serve it (:func:`choose_transport`), else ``fallback`` itself."""
    fast = choose_transport(protocol, options, transport)
    if fast is None:
        return fallback
    return DownloadTransport(fast, fallback, required=transport == "obstore")


# --------------------------------------------------------------------------- errors


class TransportUnavailable(OSError):
    """obstore cannot run in this process (see :func:`unavailable_reason`): use fsspec."""


class ServerUnsupported(TransportUnavailable):
    """The server cannot be read through obstore, though fsspec may read it: it answers
    obstore's requests with 501 Not Implemented, or without a header obstore requires
    (gcp-storage-emulator: no Last-Modified, no decoding of encoded paths). Use fsspec for
    this backend."""


class HttpStatusError(OSError):
    """The server answered with an error status (``.status``) that has no OSError subclass
    of its own; the retry layer reads the status (5xx, 408, 429 are transient)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(errno.EIO if status >= 500 else errno.EINVAL, message)
        self.status = status

    def __reduce__(self):
        return type(self), (self.status, self.strerror)


class RangeNotSupported(OSError):
    """The server ignores Range requests (obstore refuses such answers)."""


# object_store's HttpErrorKind values of failures worth retrying (Timeout is handled apart;
# Unknown covers a request that could not even be built: not worth retrying).
_TRANSIENT_KINDS = {"Connect", "Request", "Interrupted", "Decode"}


# --------------------------------------------------------------------------- the transport


def _seconds(moment: datetime | None) -> float | None:
    """A Last-Modified as whole seconds since the epoch (HTTP dates carry no more); None
    for the epoch itself, which obstore's HTTP store reports when the header is missing."""
    seconds = None if moment is None else float(int(moment.timestamp()))
    return seconds or None


_stores: dict[tuple, Any] = {}
_stores_lock = threading.Lock()
_regions: dict[str, str] = {}
_parents_stores: list[dict[tuple, Any]] = []
"""In a forked child: the stores of the parent, kept referenced forever. Dropping one runs
its Rust destructor, which reaches for the parent's runtime and hangs (seen in DataLoader
workers); they are never used either."""


def _forget_stores_after_fork() -> None:
    global _stores, _stores_lock
    _stores_lock = threading.Lock()
    _parents_stores.append(_stores)
    _stores = {}


os.register_at_fork(after_in_child=_forget_stores_after_fork)


def bucket_region(
    bucket: str, base_url: str = "https://s3.amazonaws.com", timeout: float = 30.0
) -> str:
    """The region of an S3 bucket, from the ``x-amz-bucket-region`` header that S3 sends on
    any answer to an unsigned HEAD of the bucket (what s3fs and object_store do too)."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/{bucket}", method="HEAD")
    error: OSError = OSError(errno.EINVAL, f"S3 names no region for bucket {bucket}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            region = response.headers.get("x-amz-bucket-region")
    except urllib.error.HTTPError as answer:
        region = answer.headers.get("x-amz-bucket-region")
    except OSError as exc:
        region = None
        error = TransientError(f"cannot reach S3 to find the region of {bucket}: {exc}")
    if region:
        return region
    raise error


class ObstoreTransport:
    """Ranged GETs and HEADs of one backend configuration through obstore.

    Paths are the fsspec backend's: ``bucket/key`` (s3, optionally ``?versionId=``),
    ``bucket/key`` (gcs), ``container/blob`` (az), full URLs (http).
    """

    streaming = True  # bytes reach the sink as they arrive

    def __init__(self, protocol: str, spec: StoreSpec) -> None:
        self.protocol = protocol
        self.spec = spec

    def __repr__(self) -> str:
        return f"ObstoreTransport({self.spec.shown})"

    # ---- paths and stores

    def unserved_reason(self, path: str) -> str | None:
        """Why this transport cannot fetch ``path`` (the fsspec backend must), or None."""
        try:
            self._locate(path)
        except ValueError as exc:
            return str(exc)
        return None

    def _locate(self, path: str) -> tuple[str, str, str | None]:
        """(store name: bucket, container or origin; object key; version in the path)."""
        version = None
        if self.spec.kind == "http":
            parts = urlsplit(path)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {redact_url(path)}")
            if parts.query or parts.fragment or "@" in parts.netloc:
                raise ValueError("URLs with a query, fragment or credentials are left to fsspec")
            origin = f"{parts.scheme}://{parts.netloc}"
            key = unquote(parts.path.lstrip("/"))
        else:
            text = path.split("://", 1)[1] if "://" in path else path
            if self.spec.kind == "s3" and "?versionId=" in text:
                text, version = text.split("?versionId=", 1)
            if "?" in text or "#" in text:
                raise ValueError("paths with a query or fragment are left to fsspec")
            origin, _, key = text.lstrip("/").partition("/")
        segments = key.split("/")
        if not origin or not key or any(s in ("", ".", "..") for s in segments):
            raise ValueError(f"obstore cannot address {redact_url(path)!r} as an object key")
        return origin, key, version

    def _store(self, origin: str, timeout: float | None) -> Any:
        key = (self.spec.key, origin, timeout)
        with _stores_lock:
            store = _stores.get(key)
        if store is None:
            try:
                built = self._build(origin, timeout)
            except (ValueError, TypeError) as exc:  # obstore refused the configuration
                problem = str(exc).split("\n", 1)[0]
                for secret in self.spec.secrets:
                    problem = problem.replace(secret, REDACTED)
                failure = ValueError(f"obstore rejects {self.spec.shown}: {redact_text(problem)}")
            else:
                with _stores_lock:
                    return _stores.setdefault(key, built)
            raise failure
        return store

    def _build(self, origin: str, timeout: float | None) -> Any:
        from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

        spec = self.spec
        client = dict(spec.client)
        client["timeout"] = _NO_OVERALL_LIMIT
        if timeout:
            client["connect_timeout"] = timedelta(seconds=timeout)
            client["read_timeout"] = timedelta(seconds=timeout)
        common = {"client_options": client, "retry_config": {"max_retries": 0}}
        if spec.credentials is not None:
            common["credential_provider"] = spec.credentials
        if spec.kind == "http":
            if origin.startswith("http://"):
                client["allow_http"] = True
            return HTTPStore.from_url(origin, **common)
        config = dict(spec.config)
        if spec.kind == "s3":
            if spec.bucket_region:
                region = _regions.get(origin) or bucket_region(origin, timeout=timeout or 30.0)
                _regions[origin] = region
                config.update(region=region, endpoint=f"https://s3.{region}.amazonaws.com")
            return S3Store(origin, config=config, **common)
        if spec.kind == "gcs":
            return GCSStore(origin, config=config, **common)
        return AzureStore(origin, config=config, **common)

    # ---- errors

    def _url(self, origin: str, key: str) -> str:
        if self.spec.kind == "http":
            return f"{origin}/{key}"
        return f"{self.protocol}://{origin}/{key}"

    def _error(self, exc: BaseException, url: str, action: str) -> BaseException:
        """``exc`` from obstore as the OSError the retry layer classifies, with a
        secret-free message and no chain."""
        import obstore.exceptions as oe

        if not isinstance(exc, oe.BaseError | OSError):
            return exc  # a bug or a sink's own error: not ours to translate
        text = str(exc)
        summary = text.split("\n\nDebug source:", 1)[0].strip()
        for secret in self.spec.secrets:
            summary = summary.replace(secret, REDACTED)
        detail = " ".join(redact_text(summary, url).split())
        if len(detail) > 300:
            detail = detail[:297] + "..."
        shown = redact_url(url)
        status_match = _STATUS_RE.search(text)
        status = int(status_match.group(1)) if status_match else None
        message = f"{action} {shown}: {detail}"
        error: OSError
        if isinstance(exc, FileNotFoundError) or status in (404, 410):
            error = FileNotFoundError(errno.ENOENT, f"not found: {shown} ({detail})")
        elif isinstance(exc, oe.PermissionDeniedError | oe.UnauthenticatedError) or status in (
            401,
            403,
        ):
            error = PermissionError(errno.EACCES, f"permission denied: {shown} ({detail})")
        elif isinstance(exc, oe.PreconditionError) or status == 412:
            error = VersionMismatch(errno.ESTALE, f"{shown} changed: {detail}")
        elif isinstance(exc, oe.NotSupportedError) and "Range" in text:
            error = RangeNotSupported(errno.EINVAL, f"no range requests: {message}")
        elif (other := _OTHER_RANGE_RE.search(text)) is not None:  # checked by obstore
            error = TransientError(
                errno.EIO,
                f"Content-Range starts at byte {other.group(3)}, asked for {other.group(1)}: "
                f"{message}",
            )
        elif status == 501 or "source: Header" in text:
            error = ServerUnsupported(errno.ENOTSUP, f"the server cannot serve obstore: {message}")
        elif status is not None:
            error = HttpStatusError(status, message)
        else:
            kind_match = _KIND_RE.search(text)
            kind = kind_match.group(1) if kind_match else None
            if kind == "Timeout":
                error = TimeoutError(errno.ETIMEDOUT, f"no progress: {message}")
            elif kind == "Connect":
                error = ConnectionError(errno.ECONNREFUSED, f"cannot connect: {message}")
            elif kind in _TRANSIENT_KINDS:
                error = ConnectionResetError(errno.ECONNRESET, f"connection failed: {message}")
            else:
                error = OSError(errno.EIO, message)
        error.__suppress_context__ = True
        return error

    def _open(self, path: str, timeout: float | None) -> tuple[Any, str, str | None, str]:
        """(store, key, version named in the path, URL for messages) for ``path``."""
        origin, key, version = self._locate(path)
        url = self._url(origin, key)
        reason = unavailable_reason()
        if reason is not None:
            raise TransportUnavailable(errno.ENOTSUP, f"{redact_url(url)}: {reason}")
        return self._store(origin, timeout), key, version, url

    def _call(self, url: str, action: str, function: Callable[[], Any]) -> Any:
        """``function()`` (one obstore request), its failure translated by :meth:`_error`."""
        global _runtime_pid
        _runtime_pid = os.getpid()
        try:
            return function()
        except Exception as exc:
            error = self._error(exc, url, action)
        raise error

    # ---- the operations

    def info(self, path: str, timeout: float | None = None) -> Version:
        """Size and version of the object at ``path`` (a HEAD request)."""
        import obstore

        store, key, version, url = self._open(path, timeout)
        if version is not None:
            meta = self._call(
                url,
                "HEAD",
                lambda: obstore.get(store, key, options={"head": True, "version": version}).meta,
            )
        else:
            meta = self._call(url, "HEAD", lambda: obstore.head(store, key))
        return Version(
            meta["size"], meta["e_tag"], meta["version"], _seconds(meta["last_modified"])
        )

    def stream(
        self,
        path: str,
        start: int,
        end: int | None,
        sink: Sink,
        timeout: float | None,
        rest_of_body: bool = False,
        expect: Version | None = None,
    ) -> Facts:
        """Pass bytes ``[start, end)`` of ``path`` to ``sink`` in order, as they arrive, and
        return what the server said about them. ``end=None`` reads to the object's end.

        With ``expect``, the request is conditional on that version (If-Match on its strong
        ETag, else If-Unmodified-Since; its version id / generation is asked for), and an
        answer of any other version raises ``VersionMismatch`` before a byte is passed
        (``versions.check_response``, which also fills in what ``expect`` lacks). May pass
        fewer bytes than asked (the object is shorter) or raise after passing some (a cut,
        a stall): everything passed is correct data from ``start`` on. A server that ignores
        Range sends the whole object: bytes ``[start, end)`` of it are passed, or with
        ``rest_of_body`` everything from ``start`` on.
        """
        import obstore

        if start < 0 or (end is not None and end <= start):
            raise ValueError(f"empty or negative range [{start}, {end})")
        store, key, path_version, url = self._open(path, timeout)
        options = _conditions(expect, path_version)
        action = f"GET bytes {start}-{'' if end is None else end - 1} of"
        asked = {"offset": start} if end is None else (start, end)
        ranged = {**options, "range": asked}
        try:
            result = self._call(url, action, lambda: obstore.get(store, key, options=ranged))
        except RangeNotSupported:
            result = None
        wanted = None if end is None else end - start
        if result is None:  # the server ignores Range: take the body from its start
            result = self._call(url, "GET", lambda: obstore.get(store, key, options=options))
            status, skip, stop = 200, start, None if rest_of_body else wanted
        else:
            status, skip, stop = 206, 0, wanted
        try:
            meta = result.meta
            first, last = result.range
            facts = Facts(
                status=status,
                start=first if status == 206 else None,
                total=meta["size"],
                etag=meta["e_tag"],
                version=meta["version"],
                modified=_seconds(meta["last_modified"]),
            )
            check_response(facts, start, expect)
            expected_range = (start, meta["size"] if end is None else min(end, meta["size"]))
            if status == 206 and (first, last) != expected_range:
                raise TransientError(
                    f"{redact_url(url)}: asked for bytes {start}-{expected_range[1] - 1}, "
                    f"got {first}-{last - 1}"
                )
            # as received: a cut loses nothing
            self._pump(result.stream(min_chunk_size=0), sink, skip, stop, url, action)
        finally:
            del result  # not kept by the traceback of a failure: see _pump
        return facts

    def _pump(self, body: Any, sink: Sink, skip: int, stop: int | None, url: str, action: str):
        """Hand the body to ``sink``: ``skip`` bytes dropped first, at most ``stop`` passed.

        The body is released on the way out, also when this raises: a traceback keeping it
        would leave an open response for a garbage collection, possibly in a forked child
        (a DataLoader worker), where dropping it waits for runtime threads that exist only
        in the parent, forever if one was handing it bytes at the fork.
        """
        failure = None
        try:
            while stop is None or stop > 0:
                try:
                    piece = next(body)
                except StopIteration:
                    break
                except Exception as exc:
                    failure = self._error(exc, url, action)
                    break
                if skip:
                    dropped = min(skip, len(piece))
                    piece, skip = piece[dropped:], skip - dropped
                if stop is not None:
                    piece = piece[:stop]
                    stop -= len(piece)
                if piece:
                    sink(piece)
        finally:
            del body
        if failure is not None:
            raise failure


def _conditions(expect: Version | None, path_version: str | None) -> dict[str, Any]:
    """obstore's GET options pinning the request to ``expect``: its version id / generation
    (or the one the path names), If-Match on a strong ETag, else If-Unmodified-Since."""
    options: dict[str, Any] = {}
    version = path_version or (expect.version if expect else None)
    if version:
        options["version"] = str(version)
    if expect is None:
        return options
    if expect.strong_etag:  # If-Match compares strong ETags only
        options["if_match"] = expect.strong_etag
    elif expect.modified is not None:
        options["if_unmodified_since"] = datetime.fromtimestamp(expect.modified, timezone.utc)
    return options
