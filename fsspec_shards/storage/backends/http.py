"""HTTP(S) (fsspec's aiohttp filesystem; obstore's HTTP store): what the layer knows of it.

Redirects: aiohttp follows a redirect to another origin with every header but
``Authorization``/``Cookie``/``Proxy-Authorization``, so a custom credential header
(``X-Api-Key``, ``x-amz-security-token``, ...) would reach whatever host a server points
at. :func:`same_origin_headers`, a client middleware every tamed session gets, sends
across origins only :data:`CROSS_ORIGIN_HEADERS` (what says which bytes, none a secret).
"""

from __future__ import annotations

import contextvars
from typing import Any

PROTOCOLS = ("http", "https")

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
