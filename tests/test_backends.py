"""The backends' own retries are turned down before wds wraps them; user settings win."""

from __future__ import annotations

import aiohttp
import fsspec

from fsspec_shards.storage.backends import backend_timeout, tame_instance, tamed_target_options

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


def test_s3_gets_one_botocore_attempt_and_socket_timeouts_unless_the_user_set_them():
    tamed = tamed_target_options("s3", {"anon": True}, timeout=7.0)
    config = tamed["config_kwargs"]
    assert config["retries"]["max_attempts"] == 1
    assert (config["connect_timeout"], config["read_timeout"]) == (7.0, 7.0)
    assert tamed["skip_instance_cache"] is True
    mine = {"config_kwargs": {"retries": {"max_attempts": 9}, "read_timeout": 3}}
    kept = tamed_target_options("s3", mine, timeout=7.0)["config_kwargs"]
    assert kept["retries"] == {"max_attempts": 9} and kept["read_timeout"] == 3
    assert mine == {"config_kwargs": {"retries": {"max_attempts": 9}, "read_timeout": 3}}


def test_http_gets_socket_timeouts_unless_the_user_set_a_timeout():
    tamed = tamed_target_options("https", {}, timeout=5.0)
    assert tamed["client_kwargs"]["timeout"].sock_read == 5.0
    mine = aiohttp.ClientTimeout(total=99)
    kept = tamed_target_options("http", {"client_kwargs": {"timeout": mine}}, timeout=5.0)
    assert kept["client_kwargs"]["timeout"] is mine


def test_s3fs_instance_retries_once():
    s3 = fsspec.filesystem("s3", **tamed_target_options("s3", {"anon": True}, 5.0))
    tame_instance(s3, "s3")
    assert s3.retries == 1
    assert fsspec.filesystem("s3", anon=True).retries != 1  # the user's own instance is untouched


def test_gcsfs_instance_sends_requests_without_its_retry_decorator():
    gcs = fsspec.filesystem("gcs", **tamed_target_options("gcs", {"token": "anon"}, 5.0))
    tame_instance(gcs, "gcs")
    assert gcs._request.__func__ is type(gcs)._request.__wrapped__


def test_azure_sdk_retries_are_off():
    options = tamed_target_options("az", {"connection_string": AZURITE}, 5.0)
    az = fsspec.filesystem("az", **options)
    tame_instance(az, "az")
    assert az.service_client._config.retry_policy.total_retries == 0


def test_private_instances_keep_no_listing_cache_and_share_nothing_with_the_users():
    for protocol in ("s3", "gcs", "https"):
        tamed = tamed_target_options(protocol, {"use_listings_cache": True}, 5.0)
        assert tamed["use_listings_cache"] is False and tamed["skip_instance_cache"] is True
    assert "use_listings_cache" not in tamed_target_options("file", {}, 5.0)


def test_the_shortest_socket_time_out_the_user_gave_the_backend_is_found():
    def built(protocol: str, options: dict):
        return fsspec.filesystem(protocol, **tamed_target_options(protocol, options, 30.0))

    assert backend_timeout(built("s3", {"anon": True, "config_kwargs": {"read_timeout": 3}})) == 3
    assert backend_timeout(built("s3", {"anon": True})) == 30.0  # ours, set on the client
    assert backend_timeout(built("gcs", {"token": "anon", "requests_timeout": 2})) == 2
    assert backend_timeout(built("gcs", {"token": "anon"})) is None
    az = {"connection_string": AZURITE, "read_timeout": 2, "connection_timeout": 4}
    assert backend_timeout(built("az", az)) == 2
    mine = aiohttp.ClientTimeout(total=None, sock_connect=9, sock_read=2.5)
    assert backend_timeout(built("https", {"client_kwargs": {"timeout": mine}})) == 2.5
    assert backend_timeout(fsspec.filesystem("file")) is None
