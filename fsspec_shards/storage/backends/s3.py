"""S3 (s3fs; obstore's S3 store): everything the layer knows of it.

- Which fields of ``info()`` name a version and carry checksums, the socket time-outs, the
  taming of s3fs's and botocore's own retries, botocore's failure names and AWS's
  throttling codes, the streaming GET (:meth:`S3Backend.open_range`), and the obstore
  mapping (:data:`OBSTORE_TABLE` plus :func:`obstore_credentials`).
- Where one configuration's objects live, for the cache key and the obstore store alike:
  resolved by :mod:`.s3_location`, kept per instance here (:func:`located`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qs, urlsplit

import fsspec

from fsspec_shards.redact import REDACTED, redact_text
from fsspec_shards.storage.backends import failure_names
from fsspec_shards.storage.backends.base import (
    FSSPEC_INSTANCE_OPTIONS,
    IGNORED_COMMON,
    Backend,
    Options,
    StoreSpec,
    as_bool,
    http_endpoint,
    parameters,
    range_header,
    tls,
    within,
)
from fsspec_shards.storage.backends.s3_location import (
    Location,
    botocore_location,
    environment_location,
    resolve,
)
from fsspec_shards.storage.backends.versions import (
    Facts,
    VersionFields,
    parse_content_range,
    timestamp,
)
from fsspec_shards.storage.core.integrity import Checksum
from fsspec_shards.storage.deps import fsspec as fsspec_deps
from fsspec_shards.storage.deps import s3fs as s3fs_deps

_PLAIN_MD5_ETAG = re.compile(r"^[0-9a-fA-F]{32}$")


_LOCATIONS: dict[int, tuple[Location, str]] = {}


def located(fs: fsspec.AbstractFileSystem) -> Location:
    """The location of s3fs instance ``fs``, resolved once per instance (s3fs reads the
    environment and config files once too, when it makes its client)."""
    return _resolved(fs)[0]


def _resolved(fs: fsspec.AbstractFileSystem) -> tuple[Location, str]:
    """The location of ``fs`` and its form in the cache key, kept per instance: each read
    names its object with it."""
    found = _LOCATIONS.get(id(fs))
    if found is None:
        location = resolve(
            {
                "endpoint_url": getattr(fs, "endpoint_url", None),
                "client_kwargs": getattr(fs, "client_kwargs", None),
                "config_kwargs": getattr(fs, "config_kwargs", None),
                "profile": (getattr(fs, "kwargs", None) or {}).get("profile"),
                "session": getattr(fs, "session", None),
            }
        )
        found = _LOCATIONS[id(fs)] = (location, str(location))
        weakref.finalize(fs, _LOCATIONS.pop, id(fs), None)
    return found


BOTOCORE_CLIENT_OPTIONS = frozenset(
    {
        "api_version",
        "aws_access_key_id",
        "aws_account_id",
        "aws_secret_access_key",
        "aws_session_token",
        "config",
        "endpoint_url",
        "region_name",
        "use_ssl",
        "verify",
    }
)
"""What s3fs's ``client_kwargs`` may hold: the named parameters of botocore's
``Session.create_client`` but ``service_name``, listed so that checking options imports no
botocore (a test holds them to botocore's)."""
BOTOCORE_CONFIG_OPTIONS = frozenset(
    {
        "account_id_endpoint_mode",
        "auth_scheme_preference",
        "client_cert",
        "client_context_params",
        "connect_timeout",
        "defaults_mode",
        "disable_request_compression",
        "endpoint_discovery_enabled",
        "ignore_configured_endpoint_urls",
        "inject_host_prefix",
        "max_pool_connections",
        "parameter_validation",
        "proxies",
        "proxies_config",
        "read_timeout",
        "region_name",
        "request_checksum_calculation",
        "request_min_compression_size_bytes",
        "response_checksum_validation",
        "retries",
        "s3",
        "s3_disable_express_session_auth",
        "signature_version",
        "sigv4a_signing_region_set",
        "tcp_keepalive",
        "use_dualstack_endpoint",
        "use_fips_endpoint",
        "user_agent",
        "user_agent_appid",
        "user_agent_extra",
    }
)
"""What s3fs's ``config_kwargs`` may hold: botocore's ``Config.OPTION_DEFAULTS`` (a test
holds them to botocore's)."""


S3FS_PARAMETERS = frozenset(
    {
        "anon",
        "asynchronous",
        "cache_regions",
        "client_kwargs",
        "config_kwargs",
        "default_block_size",
        "default_cache_type",
        "default_fill_cache",
        "endpoint_url",
        "fixed_upload_size",
        "key",
        "local_expiry_check",
        "loop",
        "max_concurrency",
        "password",
        "requester_pays",
        "s3_additional_kwargs",
        "secret",
        "session",
        "token",
        "use_ssl",
        "username",
        "version_aware",
    }
)
"""The named parameters of ``S3FileSystem.__init__`` (a test holds them to s3fs's)."""
S3FS_OPTIONS = S3FS_PARAMETERS | {
    "batch_size",
    "event_hooks",
    "include_builtin_handlers",
    "profile",
    "session_vars",
}
"""Every option s3fs takes: its own, ``AsyncFileSystem``'s ``batch_size`` and what it passes
on to aiobotocore's ``AioSession`` (a test holds them to the classes')."""


class UnbuiltS3FileSystem:
    """An s3fs filesystem not built yet, so that a read through obstore never imports s3fs
    (0.3-0.7 s: aiobotocore, aiohttp), in a process nor in a DataLoader worker. It answers
    from its options what s3fs's instance would: its protocol, ``storage_options``, the
    attributes :func:`located` and the time-outs read, path naming (fsspec's default rule,
    which s3fs keeps), and ``invalidate_cache`` (nothing is cached yet); any other
    attribute builds the filesystem (``build``, once) and is the built one's."""

    protocol = ("s3", "s3a")
    root_marker = ""
    _strip_protocol = fsspec_deps.default_strip_protocol()
    unstrip_protocol = fsspec.AbstractFileSystem.unstrip_protocol

    @staticmethod
    def _get_kwargs_from_urls(url: str) -> dict[str, Any]:
        """s3fs's rule: a ``versionId`` in the query makes the filesystem version-aware."""
        return {"version_aware": True} if "versionId" in parse_qs(urlsplit(url).query) else {}

    def __init__(self, options: Mapping[str, Any], build: Callable[[], Any]) -> None:
        # fsspec's instance cache takes skip_instance_cache; the instance keeps the rest
        self.storage_options = {k: v for k, v in options.items() if k != "skip_instance_cache"}
        self.endpoint_url = options.get("endpoint_url")
        self.client_kwargs = options.get("client_kwargs") or {}
        self.config_kwargs = options.get("config_kwargs") or {}
        self.session = options.get("session")
        self.kwargs = {
            name: value
            for name, value in options.items()
            if name not in S3FS_PARAMETERS and name not in FSSPEC_INSTANCE_OPTIONS
        }
        self.asynchronous = bool(options.get("asynchronous", False))
        self._build = build
        self._built: Any = None
        self._lock = threading.Lock()

    def built(self) -> Any:
        """The s3fs filesystem, built on the first call."""
        with self._lock:
            if self._built is None:
                self._built = self._build()
            return self._built

    def invalidate_cache(self, path: str | None = None) -> None:
        if self._built is not None:
            self._built.invalidate_cache(path)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_build", "_built", "_lock"):
            raise AttributeError(name)
        return getattr(self.built(), name)


class S3Backend(Backend):
    """s3fs."""

    protocols = ("s3", "s3a")
    version_fields = VersionFields(
        etag=("ETag",), version=("VersionId",), modified=("LastModified",), no_version=("", "null")
    )
    """The ``info()`` fields of a version: a ``VersionId`` of "null" is an unversioned bucket."""
    checksum_fields = (("sha256", "ChecksumSHA256", 64), ("crc32c", "ChecksumCRC32C", 8))
    remote = True
    head_gives_info = True
    errors = failure_names.S3
    option_tables = {
        "client_kwargs": lambda: BOTOCORE_CLIENT_OPTIONS,
        "config_kwargs": lambda: BOTOCORE_CONFIG_OPTIONS,
    }
    filesystem_options = S3FS_OPTIONS
    unbuilt = UnbuiltS3FileSystem

    def location(self, fs: fsspec.AbstractFileSystem) -> str:
        """The location of s3fs instance ``fs`` as the cache key holds it."""
        return _resolved(fs)[1]

    def passed_on(self) -> set[str]:
        """The options s3fs passes on beyond its own: aiobotocore's ``AioSession``'s."""
        from aiobotocore.session import AioSession

        return parameters(AioSession.__init__)

    def checksums(self, info: Mapping[str, Any]) -> list[Checksum]:
        """The checksums ``info()`` carries: the ETag when it is a plain MD5 (not multipart,
        not KMS- or customer-key-encrypted), ``ChecksumSHA256``, ``ChecksumCRC32C``."""
        found = []
        etag = str(info.get("ETag") or "").strip('"')
        encrypted = info.get("ServerSideEncryption") == "aws:kms" or info.get(
            "SSECustomerAlgorithm"
        )
        if _PLAIN_MD5_ETAG.match(etag) and not encrypted:
            found.append(Checksum("md5", etag.lower()))
        return found + super().checksums(info)

    def info_from_head(self, meta: Mapping[str, Any], name: str) -> dict[str, Any]:
        """s3fs's ``info()`` of object ``name`` (``bucket/key``) from obstore's answer to a
        HEAD of it: the same size, ``ETag``, ``VersionId`` and ``LastModified`` (the version
        fields, and the MD5 ETag :meth:`checksums` reads: s3fs's ``info()`` carries no
        checksum header)."""
        return {
            "name": name,
            "type": "file",
            "size": meta["size"],
            "ETag": meta["e_tag"] or "",
            "LastModified": meta["last_modified"],
            "VersionId": meta["version"],
        }

    def socket_timeouts(self, fs: fsspec.AbstractFileSystem) -> list[Any]:
        """botocore's ``connect_timeout`` and ``read_timeout`` as configured on ``fs``."""
        config = getattr(fs, "config_kwargs", None) or {}
        return [config.get("connect_timeout"), config.get("read_timeout")]

    def _tame_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        """botocore at one attempt and ``timeout`` socket time-outs, unless the user set
        them."""
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        return {**options, "config_kwargs": config}

    def tame_instance(self, fs: fsspec.AbstractFileSystem) -> None:
        """s3fs's own ``_error_wrapper`` loop around every call: one attempt."""
        fs.retries = 1

    @contextlib.asynccontextmanager
    async def open_range(self, fs, path, start, end, expect, timeout) -> AsyncIterator:
        """``get_object`` through s3fs's aiobotocore client, pinned to the version
        expected."""
        bucket, key, version = fs.split_path(path)
        extra: dict[str, str] = {}
        if version:
            extra["VersionId"] = version
        elif expect is not None and expect.version and expect.version != "null":
            extra["VersionId"] = str(expect.version)
        if expect is not None and expect.strong_etag:
            extra["IfMatch"] = expect.strong_etag
        response = await within(
            s3fs_deps.call_s3(
                fs, "get_object", Bucket=bucket, Key=key, Range=range_header(start, end), **extra
            ),
            timeout,
        )
        body = response["Body"]
        try:
            yield _facts(response), body.read
        finally:
            body.close()

    def obstore_store(self, options: Options) -> StoreSpec:
        """The obstore S3 store (:func:`obstore_store`)."""
        return obstore_store(options)


def _facts(response: Mapping[str, Any]) -> Facts:
    """The facts of a ``get_object`` response."""
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
    first, stop, total = parse_content_range(response.get("ContentRange"))
    if status == 200 and not response.get("ContentEncoding"):
        total = response.get("ContentLength")
    return Facts(
        status=status,
        start=first,
        stop=stop,
        total=total,
        etag=response.get("ETag"),
        version=response.get("VersionId"),
        modified=timestamp(response.get("LastModified")),
    )


# -- obstore ---------------------------------------------------------------------------

OBSTORE_IGNORED = IGNORED_COMMON | {
    "fixed_upload_size",
    "cache_regions",
    "local_expiry_check",
    "version_aware",
}
_IGNORED_CONFIG = frozenset(
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
_WRITE_ONLY = frozenset(
    {"ServerSideEncryption", "SSEKMSKeyId", "ACL", "StorageClass", "ContentType", "Metadata"}
)
OBSTORE_TABLE = {
    "key": ("key", "username", "client_kwargs.aws_access_key_id"),
    "secret": ("secret", "password", "client_kwargs.aws_secret_access_key"),
    "token": ("token", "client_kwargs.aws_session_token"),
    # resolved by s3_location.resolve(); taken here so that they count as mapped
    "endpoint": ("endpoint_url", "client_kwargs.endpoint_url"),
    "region": ("client_kwargs.region_name", "config_kwargs.region_name"),
    "ignore_configured": ("config_kwargs.ignore_configured_endpoint_urls",),
}
"""Where each setting of the S3 store comes from: the first source given wins."""


def obstore_store(options: Options) -> StoreSpec:
    """The obstore S3 store going where s3fs would, signing as s3fs would."""
    client_kwargs = options.nested("client_kwargs")  # refused here if not a mapping
    options.nested("config_kwargs")
    if options.take("session") is not None:
        raise options.refused("session", "a botocore session object cannot be carried over")
    where_to = _obstore_location(options)
    given = {name: options.pick(*sources) for name, sources in OBSTORE_TABLE.items()}
    config = {"virtual_hosted_style_request": False, "request_payer": False}
    client = tls(client_kwargs, "verify", client_kwargs.take("verify"))
    if not as_bool(options, "use_ssl", options.take("use_ssl", True)) and not where_to.endpoint:
        raise options.refused("use_ssl", "plain-HTTP AWS endpoints are not supported")
    anon = _signing(options, where_to, config)
    _extra_arguments(options, config)
    client_kwargs.finish()
    credentials, secrets, how = obstore_credentials(options, anon, given)
    config["skip_signature"] = credentials is None
    bucket_region = False
    endpoint, region = where_to.endpoint, where_to.region
    if endpoint:
        config.update(endpoint=endpoint, region=region or "us-east-1")
        client.update(http_endpoint(endpoint))
    elif region:
        config.update(endpoint=f"https://s3.{region}.amazonaws.com", region=region)
    else:
        bucket_region = True
    options.finish(OBSTORE_IGNORED)
    where = endpoint or (f"AWS {region}" if region else "AWS (region from the bucket)")
    shown = redact_text(f"s3 at {where} ({how})")
    return StoreSpec("s3", config, client, credentials, secrets, shown, bucket_region)


def _obstore_location(options: Options) -> Location:
    found = environment_location(options.given)
    if found is not None:
        return found
    try:
        from fsspec_shards.storage.deps.botocore import Error
    except ImportError:
        raise options.refused(
            "target_protocol", "botocore is not installed to resolve the endpoint"
        ) from None
    try:
        return botocore_location(options.given)
    except Error as exc:  # an unknown profile, a missing services section, a bad file
        raise options.refused(
            "profile" if options.given.get("profile") else "endpoint_url",
            redact_text(f"botocore: {exc}"),
        ) from None


def _signing(options: Options, where_to: Location, config: dict[str, Any]) -> bool:
    """Apply ``config_kwargs`` (signature version, addressing style); whether anonymous."""
    config_kwargs = options.nested("config_kwargs")
    anon = as_bool(options, "anon", options.take("anon", False))
    signature = config_kwargs.take("signature_version")
    if signature is not None:
        if str(signature).upper() == "UNSIGNED":
            anon = True
        elif signature not in ("s3v4", "v4"):
            raise config_kwargs.refused("signature_version", f"{signature!r} is not SigV4")
    addressing = config_kwargs.nested("s3")
    style = addressing.take("addressing_style", "auto")
    if style == "virtual":
        if where_to.endpoint:
            raise addressing.refused(
                "addressing_style", "virtual-host addressing with a custom endpoint"
            )
        config["virtual_hosted_style_request"] = True
    elif style not in ("auto", "path"):
        raise addressing.refused("addressing_style", f"unknown style {style!r}")
    addressing.finish()
    config_kwargs.finish(_IGNORED_CONFIG)
    return anon


def _extra_arguments(options: Options, config: dict[str, Any]) -> None:
    """Apply ``s3_additional_kwargs`` and ``requester_pays``."""
    extra = options.nested("s3_additional_kwargs")
    payer = extra.take("RequestPayer")
    if payer is not None:
        if str(payer).lower() != "requester":
            raise extra.refused("RequestPayer", f"unknown value {payer!r}")
        config["request_payer"] = True
    for name in extra.remaining():
        if name.startswith("SSECustomer"):
            raise extra.refused(name, "customer-provided encryption keys are not supported")
    extra.finish(_WRITE_ONLY)
    if as_bool(options, "requester_pays", options.take("requester_pays", False)):
        config["request_payer"] = True


def obstore_credentials(
    options: Options, anon: bool, given: Mapping[str, Any]
) -> tuple[Any, tuple[str, ...], str]:
    """The credential provider (None: unsigned), the secrets to mask, and how it signs:
    the keys given, else botocore's credential chain for the profile, as s3fs."""
    key, secret, token = given["key"], given["secret"], given["token"]
    profile = options.take("profile")
    if anon:
        return None, (), "anonymous"
    if key or secret:
        if not (key and secret):
            raise options.refused(
                "key" if not key else "secret", "an access key needs both key and secret"
            )
        credential = {"access_key_id": key, "secret_access_key": secret, "token": token}
        secrets = (secret, token) if token else (secret,)
        return StaticCredentials({**credential, "expires_at": None}), secrets, "access key"
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        raise options.refused(
            "key", "no key given and botocore is not installed to find credentials"
        ) from None
    try:
        credentials = botocore.session.Session(profile=profile).get_credentials()
    except botocore.exceptions.BotoCoreError as exc:  # ProfileNotFound, config parse errors
        raise options.refused(
            "profile" if profile else "key", redact_text(f"botocore: {exc}")
        ) from None
    if credentials is None:
        raise options.refused(
            "profile" if profile else "key",
            "no key given and botocore's credential chain found none",
        )
    how = f"profile {profile}" if profile else "default credential chain"
    return BotocoreCredentials(credentials, profile), (), how


class StaticCredentials:
    """An obstore credential provider that hands out the credentials the user gave."""

    def __init__(self, credential: dict[str, Any]) -> None:
        self._credential = credential
        self.cache_key = hashlib.sha256(repr(sorted(credential.items())).encode()).hexdigest()

    def __call__(self) -> dict[str, Any]:
        return dict(self._credential)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({REDACTED})"


class BotocoreCredentials:
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
