"""S3's location: one resolution (botocore's) for the cache key and the obstore store."""

from __future__ import annotations

import fsspec
import pytest

from fsspec_shards.storage.backends import s3
from fsspec_shards.storage.identity import backend_location
from fsspec_shards.storage.obstore_options import map_options
from tests.aws_config import aws_config_fixture  # noqa: F401 (the aws_config fixture)

CONFIG = "[default]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:9001\n"


def _s3fs(**options):
    return fsspec.filesystem("s3", skip_instance_cache=True, anon=True, **options)


def test_the_config_files_endpoint_and_region_are_the_location(aws_config):
    aws_config(CONFIG)
    assert s3.resolve({}) == s3.Location("http://127.0.0.1:9001", "eu-west-3", None)
    assert s3.resolve({"endpoint_url": "http://127.0.0.1:9009"}).endpoint == (
        "http://127.0.0.1:9009"
    )
    given = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9008", "region_name": "x"}}
    assert s3.resolve(given) == s3.Location("http://127.0.0.1:9008", "x", None)


@pytest.mark.parametrize("how", ["env", "config file", "config_kwargs"])
def test_ignoring_configured_endpoints_means_aws(aws_config, how):
    ignoring = "ignore_configured_endpoint_urls = true\n"
    aws_config(CONFIG + (ignoring if how == "config file" else ""))
    aws_config.env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9002")
    if how == "env":
        aws_config.env.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    options = {}
    if how == "config_kwargs":
        options = {"config_kwargs": {"ignore_configured_endpoint_urls": True}}
    assert s3.resolve(options) == s3.Location(None, "eu-west-3", None)


@pytest.mark.parametrize(
    "config, env",
    [
        (CONFIG, {}),
        (CONFIG, {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}),
        (CONFIG, {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9003"}),
        ("[profile p]\nendpoint_url = http://127.0.0.1:9004\n", {"AWS_PROFILE": "p"}),
        ("[default]\nregion = ap-south-1\n", {}),
    ],
)
def test_the_cache_key_and_the_obstore_store_name_one_endpoint(aws_config, config, env):
    """The defect of issue 22: the key named an endpoint the requests never went to."""
    pytest.importorskip("obstore")
    aws_config(config)
    for name, value in env.items():
        aws_config.env.setenv(name, value)
    spec = map_options("s3", {"anon": True})
    located = s3.resolve({})
    assert backend_location(_s3fs()) == str(located)
    expected = located.endpoint or f"https://s3.{located.region}.amazonaws.com"
    assert spec.config["endpoint"] == expected
    client = _s3fs()
    client.connect()
    assert client.s3.meta.endpoint_url == expected  # where s3fs sends its requests


def test_an_instance_keeps_the_location_it_was_first_resolved_with(aws_config):
    aws_config(CONFIG)
    fs = _s3fs()
    first = s3.located(fs)
    aws_config("[default]\nendpoint_url = http://127.0.0.1:9005\n")
    assert s3.located(fs) == first
    assert s3.located(_s3fs()).endpoint == "http://127.0.0.1:9005"
