"""HTTP (``storage/backends/http.py``): the tamed aiohttp session (time-outs, the redirect
middleware) and the obstore mapping."""

from __future__ import annotations

import aiohttp
import pytest

from fsspec_shards.storage.backends import backend_for, http
from tests.obstore_helpers import (
    basic_auth,
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytestmark = pytest.mark.usefixtures("no_ambient_credentials")


async def _theirs(request, handler):
    return await handler(request)


def test_the_redirect_middleware_comes_after_the_users_own():
    client = http.tamed_client_kwargs({"middlewares": [_theirs]}, timeout=7)
    assert client["middlewares"] == (_theirs, http.same_origin_headers)
    assert client["timeout"].sock_read == 7


def test_a_time_out_the_user_set_is_kept():
    given = aiohttp.ClientTimeout(total=3)
    assert http.tamed_client_kwargs({"timeout": given}, timeout=7)["timeout"] is given


# --------------------------------------------------------------------------- taming


def test_http_gets_socket_timeouts_unless_the_user_set_a_timeout():
    tamed = backend_for("https").tamed_options({}, timeout=5.0)
    assert tamed["client_kwargs"]["timeout"].sock_read == 5.0
    mine = aiohttp.ClientTimeout(total=99)
    kept = backend_for("http").tamed_options({"client_kwargs": {"timeout": mine}}, timeout=5.0)
    assert kept["client_kwargs"]["timeout"] is mine


# --------------------------------------------------------------------------- obstore mapping


@pytest.mark.parametrize("name", ["X-Api-Key", "x-amz-security-token"])
def test_http_headers_obstore_would_carry_across_origins_are_refused(name):
    """obstore follows a redirect to another origin with every header but Authorization
    and Cookie (tests/integration/test_redirects.py)."""
    refused = refusal_of("https", {"client_kwargs": {"headers": {name: "s3cr3t"}}})
    assert refused.option == f"headers.{name}"
    assert "s3cr3t" not in str(refused)


def test_http_headers_and_basic_auth_become_default_headers():
    spec = spec_of(
        "https",
        {
            "headers": {"User-Agent": "a"},
            "client_kwargs": {
                "headers": {"Accept": "b"},
                "auth": basic_auth("user", "pa55"),
                "trust_env": True,
            },
        },
    )
    headers = spec.client["default_headers"]
    assert headers["User-Agent"] == "a" and headers["Accept"] == "b"
    assert headers["Authorization"].startswith("Basic ")
    assert "pa55" in spec.secrets
    assert headers["Authorization"].split()[1] in spec.secrets


def test_http_ssl_false_allows_invalid_certificates():
    assert spec_of("https", {"ssl": False}).client == {"allow_invalid_certificates": True}


def test_the_tamed_http_options_of_the_wds_filesystem_map():
    assert spec_of("http", backend_for("http").tamed_options({}, 30.0)).client == {}


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"ssl": object()}, "ssl"),
        ({"client_kwargs": {"connector": object()}}, "client_kwargs.connector"),
        ({"client_kwargs": {"auth": object()}}, "client_kwargs.auth"),
        ({"get_client": object()}, "get_client"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_http_options_without_an_obstore_equivalent_are_refused_by_name(options, option):
    assert refusal_of("http", options).option == option
