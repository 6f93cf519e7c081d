"""fsspec backend options -> obstore store configuration.

The user configures a backend with fsspec options (s3fs, gcsfs, adlfs, fsspec's http).
:func:`map_options` turns them into a :class:`StoreSpec` (how to build obstore stores for
that configuration), or an :class:`Unmappable` naming the option it cannot carry over and
why. ``obstore_transport.py`` builds the stores and makes the requests.

Invariants:

- The store goes where the fsspec backend would go, with the same credentials: every
  setting that decides the endpoint, the account and the signing is set explicitly, so that
  obstore's own reading of environment variables (``AWS_ENDPOINT``, ``AZURE_STORAGE_*``,
  ...) cannot send requests elsewhere. An option that cannot be carried over exactly is
  refused, never dropped.
- Options that do not change which bytes a GET returns or how it is authorised are ignored
  by name (``_IGNORED``); any other option left over after mapping is refused.
- Nothing here shows a secret: ``StoreSpec.shown`` and every refusal reason are redacted,
  and ``StoreSpec.secrets`` lists the values the transport masks in its own messages.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

from fsspec_shards.config import bool_word
from fsspec_shards.redact import REDACTED, redact_text
from fsspec_shards.storage.backends import (
    AZURE_PROTOCOLS,
    FSSPEC_INSTANCE_OPTIONS,
    GCS_PROTOCOLS,
    HTTP_PROTOCOLS,
    S3_PROTOCOLS,
    http,
    s3,
)

# Options that do not change which bytes a GET returns or how it is authorised: caching,
# listing, upload and client-pool settings of the fsspec backends, and their own time-outs
# and retries (the transport applies ours).
_IGNORED_COMMON = FSSPEC_INSTANCE_OPTIONS | frozenset(
    {
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
        self.given = dict(options)
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
    if bool_word(value) is not None:
        return bool_word(value)
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

    if options.take("session") is not None:
        raise options.refused("session", "a botocore session object cannot be carried over")
    located = _s3_location(options)
    endpoint, region = located.endpoint, located.region
    for taken, name in (
        (options, "endpoint_url"),
        (client_kwargs, "endpoint_url"),
        (client_kwargs, "region_name"),
        (config_kwargs, "region_name"),
        (config_kwargs, "ignore_configured_endpoint_urls"),
    ):
        taken.take(name)  # resolved in located
    use_ssl = _as_bool(options, "use_ssl", options.take("use_ssl", True))
    if not use_ssl and not endpoint:
        raise options.refused("use_ssl", "plain-HTTP AWS endpoints are not supported")
    client.update(_tls(client_kwargs, "verify", client_kwargs.take("verify")))

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
        credentials = _botocore_credentials(options, profile)
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


def _s3_location(options: _Options) -> s3.Location:
    """The endpoint and region s3fs would use for these options (see ``backends.s3``)."""
    try:
        from fsspec_shards.storage.deps.botocore import Error
    except ImportError:
        raise options.refused(
            "target_protocol", "botocore is not installed to resolve the endpoint"
        ) from None
    try:
        return s3.location(options.given)
    except Error as exc:  # an unknown profile, a missing services section, a bad file
        raise options.refused(
            "profile" if options.given.get("profile") else "endpoint_url",
            redact_text(f"botocore: {exc}"),
        ) from None


def _botocore_credentials(options: _Options, profile: str | None) -> Any:
    try:
        import botocore.session
    except ImportError:
        raise options.refused(
            "key", "no key given and botocore is not installed to find credentials"
        ) from None
    try:
        session = botocore.session.Session(profile=profile)
        credentials = session.get_credentials()
    except Exception as exc:  # botocore: ProfileNotFound, config parse errors
        raise options.refused(
            "profile" if profile else "key", redact_text(f"botocore: {exc}")
        ) from None
    if credentials is None:
        raise options.refused(
            "profile" if profile else "key",
            "no key given and botocore's credential chain found none",
        )
    return _BotocoreCredentials(credentials, profile)


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
    for middleware in client_kwargs.take("middlewares") or ():
        if middleware is not http.same_origin_headers:  # obstore's redirects: see below
            raise client_kwargs.refused("middlewares", "aiohttp middlewares cannot be carried over")
    if auth is not None:
        login, password = getattr(auth, "login", None), getattr(auth, "password", None)
        if login is None:
            raise client_kwargs.refused("auth", f"a {type(auth).__name__} is not aiohttp.BasicAuth")
        encoded = base64.b64encode(f"{login}:{password or ''}".encode()).decode()
        headers["Authorization"] = f"Basic {encoded}"
        secrets += [encoded, str(password or "")]
    for name in headers:
        if name.lower() not in http.OBSTORE_STRIPPED | http.CROSS_ORIGIN_HEADERS:
            raise options.refused(
                f"headers.{name}", "obstore would send it on to any origin a redirect names"
            )
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
