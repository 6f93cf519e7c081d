"""The backends' own retries are turned down before wds wraps them; user settings win."""

from __future__ import annotations

import aiohttp
import fsspec

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.fields import protocol_of

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


def test_private_instances_keep_no_listing_cache_and_share_nothing_with_the_users():
    for protocol in ("s3", "gcs", "https"):
        tamed = backend_for(protocol).tamed_options({"use_listings_cache": True}, 5.0)
        assert tamed["use_listings_cache"] is False and tamed["skip_instance_cache"] is True
    assert "use_listings_cache" not in backend_for("file").tamed_options({}, 5.0)


def test_the_shortest_socket_time_out_the_user_gave_the_backend_is_found():
    def built(protocol: str, options: dict):
        return fsspec.filesystem(protocol, **backend_for(protocol).tamed_options(options, 30.0))

    def backend_timeout(fs: fsspec.AbstractFileSystem) -> float | None:
        return backend_for(protocol_of(fs)).timeout(fs)

    assert backend_timeout(built("s3", {"anon": True, "config_kwargs": {"read_timeout": 3}})) == 3
    assert backend_timeout(built("s3", {"anon": True})) == 30.0  # ours, set on the client
    assert backend_timeout(built("gcs", {"token": "anon", "requests_timeout": 2})) == 2
    assert backend_timeout(built("gcs", {"token": "anon"})) is None
    az = {"connection_string": AZURITE, "read_timeout": 2, "connection_timeout": 4}
    assert backend_timeout(built("az", az)) == 2
    mine = aiohttp.ClientTimeout(total=None, sock_connect=9, sock_read=2.5)
    assert backend_timeout(built("https", {"client_kwargs": {"timeout": mine}})) == 2.5
    assert backend_timeout(fsspec.filesystem("file")) is None
