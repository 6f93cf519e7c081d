"""The http backend's facts: the tamed aiohttp session options."""

from __future__ import annotations

import aiohttp

from fsspec_shards.storage.backends import http


async def _theirs(request, handler):
    return await handler(request)


def test_the_redirect_middleware_comes_after_the_users_own():
    client = http.tamed_client_kwargs({"middlewares": [_theirs]}, timeout=7)
    assert client["middlewares"] == (_theirs, http.same_origin_headers)
    assert client["timeout"].sock_read == 7


def test_a_time_out_the_user_set_is_kept():
    given = aiohttp.ClientTimeout(total=3)
    assert http.tamed_client_kwargs({"timeout": given}, timeout=7)["timeout"] is given
