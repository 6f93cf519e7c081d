"""Azure Blob Storage (adlfs; obstore's Azure store): everything the layer knows of it.

Where its objects live (the account and its blob endpoint), which ``info()`` fields name a
version (``etag``, ``version_id``) and carry a checksum (``content_md5``), adlfs's socket
time-outs, the taming of the Azure SDK's own retries, azure-core's failure names, the
streaming GET (:meth:`AzureBackend.open_range`), and the obstore mapping
(:data:`OBSTORE_TABLE` plus :func:`obstore_credentials`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import fsspec

from fsspec_shards.redact import redact_text
from fsspec_shards.storage.backends import failure_names
from fsspec_shards.storage.backends.base import (
    IGNORED_COMMON,
    Backend,
    Options,
    Read,
    StoreSpec,
    as_bool,
    from_base64,
    http_endpoint,
    range_header,
    within,
)
from fsspec_shards.storage.backends.versions import VersionFields, facts_from_headers
from fsspec_shards.storage.core.integrity import Checksum
from fsspec_shards.storage.deps import adlfs as adlfs_deps
from fsspec_shards.storage.deps import azure as azure_deps
from fsspec_shards.storage.deps import fsspec as fsspec_deps

logger = logging.getLogger(__name__)


class AzureBackend(Backend):
    """adlfs."""

    protocols = ("az", "abfs", "abfss", "adl")
    version_fields = VersionFields(
        etag=("etag",), version=("version_id",), modified=("last_modified",)
    )
    remote = True
    errors = failure_names.AZURE

    def location(self, fs: fsspec.AbstractFileSystem) -> str:
        """The account and blob endpoint adlfs instance ``fs`` talks to."""
        client = getattr(fs, "service_client", None)
        url = getattr(client, "url", None) or getattr(fs, "account_url", None) or ""
        account = getattr(fs, "account_name", None) or ""
        return f"account={account};endpoint={url.split('?', 1)[0].rstrip('/')}"

    def checksums(self, info: Mapping[str, Any]) -> list[Checksum]:
        """``content_settings.content_md5``, when the blob was written with one."""
        settings = info.get("content_settings") or {}
        md5 = (
            settings.get("content_md5")
            if isinstance(settings, dict)
            else getattr(settings, "content_md5", None)
        )
        hexdigest = from_base64(md5)
        return [Checksum("md5", hexdigest)] if hexdigest and len(hexdigest) == 32 else []

    def socket_timeouts(self, fs: fsspec.AbstractFileSystem) -> list[Any]:
        """adlfs's ``connection_timeout`` and ``read_timeout``."""
        given = adlfs_deps.timeout_kwargs(fs)
        return [given.get("connection_timeout"), given.get("read_timeout")]

    def tame_instance(self, fs: fsspec.AbstractFileSystem) -> None:
        """The Azure SDK's retry policy at no retries (see ``deps/azure.py``; adlfs takes no
        retry option)."""
        if not azure_deps.no_retries(getattr(fs, "service_client", None)):
            logger.warning("adlfs changed: cannot turn down the Azure SDK's own retries")

    @contextlib.asynccontextmanager
    async def open_range(self, fs, path, start, end, expect, timeout) -> AsyncIterator:
        """One raw Get Blob request through the SDK's pipeline (whose retries are off),
        conditional on the ETag expected. The SDK's downloader is not used: it buffers
        pieces whole and retries a cut piece inside itself, out of sight of the retry
        counters."""
        from azure.core.exceptions import ResourceNotFoundError

        container, blob, version = fs.split_path(fsspec_deps.strip_protocol(fs, path))
        if not version and expect is not None and expect.version:
            version = str(expect.version)
        conditions = azure_deps.if_match(expect.etag if expect is not None else None)
        async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
            try:
                pipeline_response, body, _ = await within(
                    azure_deps.raw_download(
                        client,
                        range=range_header(start, end),
                        version_id=version,
                        modified_access_conditions=conditions,
                        **adlfs_deps.timeout_kwargs(fs),
                    ),
                    timeout,
                )
            except ResourceNotFoundError:
                missing = True
            else:
                missing = False
            if missing:
                raise FileNotFoundError(errno.ENOENT, "no such blob", path)
            response = pipeline_response.http_response
            try:
                facts = facts_from_headers(
                    response.status_code, response.headers, "x-ms-version-id"
                )
                yield facts, _reader(body)
            finally:
                await response.close()

    def obstore_store(self, options: Options) -> StoreSpec:
        """The obstore Azure store (:func:`obstore_store`)."""
        return obstore_store(options)


def _reader(body: Any) -> Read:
    """Reads of the SDK's body iterator (its own piece size)."""

    async def read(size: int) -> bytes:
        try:
            return await body.__anext__()
        except StopAsyncIteration:
            return b""

    return read


# -- obstore ---------------------------------------------------------------------------

OBSTORE_IGNORED = IGNORED_COMMON | {
    "socket_timeout",
    "connection_timeout",
    "read_timeout",
    "assume_container_exists",
    "version_aware",
}
OBSTORE_TABLE = {
    "connection_string": ("connection_string", "$AZURE_STORAGE_CONNECTION_STRING"),
    "account": ("account_name", "$AZURE_STORAGE_ACCOUNT_NAME"),
    "key": ("account_key", "$AZURE_STORAGE_ACCOUNT_KEY"),
    "sas": ("sas_token", "$AZURE_STORAGE_SAS_TOKEN"),
    "client_id": ("client_id", "$AZURE_STORAGE_CLIENT_ID"),
    "client_secret": ("client_secret", "$AZURE_STORAGE_CLIENT_SECRET"),
    "tenant_id": ("tenant_id", "$AZURE_STORAGE_TENANT_ID"),
    "credential": ("credential",),
    "account_host": ("account_host",),
}
"""Where each setting of the Azure store comes from, as adlfs reads them: the first source
given wins."""

# Azurite's published development account (not a secret), as UseDevelopmentStorage names it.
_AZURITE_ACCOUNT = "devstoreaccount1"
_AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def obstore_store(options: Options) -> StoreSpec:
    """The obstore Azure store of the account adlfs would use, with its credentials."""
    given = {name: options.pick(*sources) for name, sources in OBSTORE_TABLE.items()}
    anon = options.take("anon")
    anon = as_bool(options, "anon", _env_anon() if anon is None else anon)
    if options.take("location_mode", "primary") != "primary":
        raise options.refused("location_mode", "only the primary location is supported")
    if options.take("request_session") is not None:
        raise options.refused("request_session", "a custom HTTP session cannot be carried over")
    secrets: list[str] = []
    if given["connection_string"]:
        secrets.append(given["connection_string"])
        anon = _from_connection_string(options, given) or anon
    elif not given["account"]:
        raise options.refused(
            "account_name", "neither a connection string nor an account name given"
        )
    account = given["account"]
    endpoint = given.get("endpoint")
    if endpoint is None:
        host = given["account_host"]
        endpoint = f"https://{host}" if host else f"https://{account}.blob.core.windows.net"
    config: dict[str, Any] = {
        "account_name": account,
        "endpoint": endpoint.rstrip("/"),
        "use_emulator": False,
        "use_fabric_endpoint": False,
    }
    how = obstore_credentials(options, given, anon, config, secrets)
    options.finish(OBSTORE_IGNORED)
    shown = redact_text(f"azure account {account} at {endpoint.split('?')[0]} ({how})")
    secrets = [s for s in secrets if s]
    return StoreSpec("azure", config, http_endpoint(endpoint), None, tuple(secrets), shown)


def _env_anon() -> bool:
    return os.environ.get("AZURE_STORAGE_ANON", "false").lower() not in ("false", "0", "f", "")


def _from_connection_string(options: Options, given: dict[str, Any]) -> bool:
    """Fill ``given`` (account, key, SAS, endpoint) from the connection string; whether it
    leaves the account anonymous (neither key nor SAS)."""
    fields = _connection_fields(options, given["connection_string"])
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        given.update(account=_AZURITE_ACCOUNT, key=_AZURITE_KEY)
        given["endpoint"] = f"http://127.0.0.1:10000/{_AZURITE_ACCOUNT}"
    else:
        given["account"] = fields.get("accountname") or given["account"]
        given["key"] = fields.get("accountkey")
        given["sas"] = fields.get("sharedaccesssignature")
        given["endpoint"] = fields.get("blobendpoint")
    if not given["endpoint"]:
        if not given["account"]:
            raise options.refused(
                "connection_string", "names neither an account nor a BlobEndpoint"
            )
        scheme = fields.get("defaultendpointsprotocol", "https")
        suffix = fields.get("endpointsuffix", "core.windows.net")
        given["endpoint"] = f"{scheme}://{given['account']}.blob.{suffix}"
    if not given["account"]:
        given["account"] = urlsplit(given["endpoint"]).hostname.split(".")[0]
    return not (given["key"] or given["sas"])


def _connection_fields(options: Options, text: str) -> dict[str, str]:
    fields = {}
    for item in str(text).split(";"):
        name, sep, value = item.strip().partition("=")
        if not name:
            continue
        if not sep:
            raise options.refused("connection_string", "is not a list of name=value pairs")
        fields[name.strip().lower()] = value.strip()
    return fields


def obstore_credentials(
    options: Options, given: dict[str, Any], anon: bool, config: dict[str, Any], secrets: list
) -> str:
    """Put the credentials adlfs would use into ``config`` (account key, SAS, service
    principal, or none), their secrets into ``secrets``; how the store signs."""
    key, credential = given["key"], given["credential"]
    if isinstance(credential, str) and not key:
        key, credential = credential, None
    if credential is not None:
        raise options.refused("credential", f"a {type(credential).__name__} cannot be carried over")
    if key:
        config.update(access_key=key, credential_type="access_key", skip_signature=False)
        secrets.append(key)
        return "account key"
    if given["sas"]:
        sas = given["sas"].lstrip("?")
        config.update(sas_key=sas, credential_type="sas_token", skip_signature=False)
        secrets.append(sas)
        return "SAS token"
    if given["client_id"] and given["client_secret"] and given["tenant_id"]:
        config.update(
            client_id=given["client_id"],
            client_secret=given["client_secret"],
            tenant_id=given["tenant_id"],
            credential_type="client_secret",
            skip_signature=False,
        )
        secrets.append(given["client_secret"])
        return "service principal"
    if anon:
        config["skip_signature"] = True
        return "anonymous"
    raise options.refused(
        "account_name",
        "no key, SAS or service principal given: adlfs would use DefaultAzureCredential",
    )
