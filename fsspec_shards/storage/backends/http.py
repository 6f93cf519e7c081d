"""HTTP(S) (fsspec's aiohttp filesystem; obstore's HTTP store): what the layer knows of it.

The URL is the whole address (no location beyond it); ``ETag`` and ``Last-Modified`` name
a version, ``Content-MD5`` is a checksum; the session's socket time-outs; aiohttp's failure
names; the streaming GET (:meth:`HttpBackend.open_range`); the obstore mapping (headers,
basic auth, ``ssl=False``).

Redirects: aiohttp follows a redirect to another origin with every header but
``Authorization``/``Cookie``/``Proxy-Authorization``, so a custom credential header
(``X-Api-Key``, ``x-amz-security-token``, ...) would reach whatever host a server points
at. :func:`same_origin_headers`, a client middleware every tamed session gets, sends
across origins only :data:`CROSS_ORIGIN_HEADERS` (what says which bytes, none a secret).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import fsspec

from fsspec_shards.storage.backends import failure_names
from fsspec_shards.storage.backends.base import (
    IGNORED_COMMON,
    Backend,
    Options,
    StoreSpec,
    parameters,
    range_header,
    within,
)
from fsspec_shards.storage.backends.versions import VersionFields, facts_from_headers
from fsspec_shards.storage.deps import fsspec as fsspec_deps

CROSS_ORIGIN_HEADERS = frozenset(
    {
        "host",
        "accept",
        "accept-encoding",
        "user-agent",
        "range",
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
        "if-range",
    }
)
"""The request headers a redirect to another origin keeps."""

OBSTORE_STRIPPED = frozenset({"authorization", "cookie", "proxy-authorization"})
"""The headers obstore (reqwest) drops on a redirect to another origin: it keeps the rest,
so a configuration with another credential header is not carried over to obstore."""

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHAIN: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar(
    "fsspec_shards_redirect_chain", default=None
)
"""(the origin a redirect pointed at, the origin its request chain began at): aiohttp calls
the middleware for every hop of a chain in one task, so the next hop sees it."""


async def same_origin_headers(request: Any, handler: Any) -> Any:
    """aiohttp client middleware: a redirect hop to another origin than the one its chain
    began at carries only :data:`CROSS_ORIGIN_HEADERS`."""
    chain = _CHAIN.get()
    origin = request.url.origin()
    if chain is not None and chain[0] == origin:
        origin = chain[1]
        if request.url.origin() != origin:
            for name in list(request.headers):
                if name.lower() not in CROSS_ORIGIN_HEADERS:
                    request.headers.popall(name, None)
    response = await handler(request)
    location = response.headers.get("Location") if response.status in _REDIRECTS else None
    target = None
    if location is not None:
        try:
            target = request.url.join(type(request.url)(location)).origin()
        except ValueError:
            target = None  # not an http(s) URL: aiohttp refuses to follow it
    _CHAIN.set(None if target is None else (target, origin))
    return response


def _session_options() -> set[str]:
    import aiohttp

    return parameters(aiohttp.ClientSession.__init__)


class HttpBackend(Backend):
    """fsspec's aiohttp filesystem."""

    protocols = ("http", "https")
    version_fields = VersionFields(etag=("ETag",), modified=("Last-Modified",))
    checksum_fields = (("md5", "Content-MD5", 32),)
    remote = True
    errors = failure_names.HTTP
    option_tables = {"client_kwargs": _session_options}

    def passed_on(self) -> set[str]:
        """The options fsspec's http backend passes on: to every aiohttp request."""
        import aiohttp

        return parameters(aiohttp.ClientSession._request) - {"method", "str_or_url"}

    def socket_timeouts(self, fs: fsspec.AbstractFileSystem) -> list[Any]:
        """The socket fields of the session's ``aiohttp.ClientTimeout``."""
        client_timeout = (getattr(fs, "client_kwargs", None) or {}).get("timeout")
        return [
            getattr(client_timeout, name, None) for name in ("sock_read", "sock_connect", "connect")
        ]

    def _tame_options(self, options: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The session with socket time-outs and the redirect middleware (fsspec's http
        backend does not retry on its own)."""
        return {
            **options,
            "client_kwargs": tamed_client_kwargs(options.get("client_kwargs") or {}, timeout),
        }

    @contextlib.asynccontextmanager
    async def open_range(self, fs, path, start, end, expect, timeout) -> AsyncIterator:
        """A GET through the backend's aiohttp session with its headers and options,
        ``If-Match`` on a strong ETag."""
        session = await fs.set_session()
        kwargs = dict(fs.kwargs)
        headers = dict(kwargs.pop("headers", {}) or {})
        headers["Range"] = range_header(start, end)
        if expect is not None and expect.strong_etag:
            headers["If-Match"] = expect.strong_etag
        response = await within(
            session.get(fs.encode_url(path), headers=headers, **kwargs), timeout
        )
        async with response:
            fsspec_deps.raise_for_http_status(fs, response, path)
            yield facts_from_headers(response.status, response.headers), response.content.read

    def obstore_store(self, options: Options) -> StoreSpec:
        """The obstore HTTP store (:func:`obstore_store`)."""
        return obstore_store(options)


def tamed_client_kwargs(client_kwargs: dict[str, Any], timeout: float) -> dict[str, Any]:
    """aiohttp session options: socket time-outs at ``timeout`` unless the user set one,
    and :func:`same_origin_headers` innermost (after the user's own middlewares)."""
    import aiohttp

    client = dict(client_kwargs)
    client.setdefault(
        "timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
    )
    client["middlewares"] = (*tuple(client.get("middlewares") or ()), same_origin_headers)
    return client


# -- obstore ---------------------------------------------------------------------------

OBSTORE_IGNORED = IGNORED_COMMON | {
    "simple_links",
    "same_scheme",
    "size_policy",
    "encoded",
    "trust_env",
}
_IGNORED_CLIENT = frozenset({"timeout", "trust_env", "headers", "auth"})


def obstore_store(options: Options) -> StoreSpec:
    """The obstore HTTP store sending the backend's headers (basic auth as a header);
    refused where obstore would carry a header to another origin (see the module)."""
    client_kwargs = options.nested("client_kwargs")
    headers = dict(options.take("headers") or {})
    headers.update(client_kwargs.take("headers") or {})
    for middleware in client_kwargs.take("middlewares") or ():
        if middleware is not same_origin_headers:  # applied by obstore's own rule below
            raise client_kwargs.refused("middlewares", "aiohttp middlewares cannot be carried over")
    secrets = obstore_credentials(client_kwargs, headers)
    for name in headers:
        if name.lower() not in OBSTORE_STRIPPED | CROSS_ORIGIN_HEADERS:
            raise options.refused(
                f"headers.{name}", "obstore would send it on to any origin a redirect names"
            )
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
    client_kwargs.finish(_IGNORED_CLIENT)
    options.finish(OBSTORE_IGNORED)
    return StoreSpec("http", {}, client, None, tuple(s for s in secrets if s), "http(s) server")


def obstore_credentials(client_kwargs: Options, headers: dict[str, Any]) -> list[str]:
    """Put ``client_kwargs["auth"]`` (aiohttp.BasicAuth) into ``headers`` as
    ``Authorization``; the secrets among the headers."""
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
    return secrets
