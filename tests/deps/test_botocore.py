"""botocore's private parts we use (``storage/deps/botocore.py``): these fail when botocore
changes them. The endpoint we resolve must be the one a real botocore client is made for."""

from __future__ import annotations

import inspect

import botocore.session
import pytest
from botocore.config import Config
from botocore.configprovider import ConfiguredEndpointProvider

from fsspec_shards.storage.deps import botocore as deps
from tests.aws_config import aws_config_fixture  # noqa: F401 (the aws_config fixture)

CONFIG = """\
[default]
endpoint_url = http://127.0.0.1:9001
[profile lab]
services = lab-services
[services lab-services]
s3 =
  endpoint_url = http://127.0.0.1:9002
[profile plain]
region = eu-west-3
"""


def test_the_configured_endpoint_provider_takes_what_we_give_it():
    parameters = list(inspect.signature(ConfiguredEndpointProvider.__init__).parameters)
    assert parameters[:4] == ["self", "full_config", "scoped_config", "client_name"]
    assert callable(ConfiguredEndpointProvider.provide)


def _client_endpoint(profile: str | None, **config) -> str:
    client = botocore.session.Session(profile=profile).create_client(
        "s3",
        aws_access_key_id="AKID",
        aws_secret_access_key="secret",
        config=Config(**config),
    )
    return client.meta.endpoint_url


@pytest.mark.parametrize(
    "profile, env",
    [
        (None, {}),
        ("lab", {}),
        ("plain", {}),
        ("plain", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9003"}),
        ("lab", {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9004"}),
    ],
)
def test_the_endpoint_found_is_the_one_botocores_client_uses(aws_config, profile, env):
    aws_config(CONFIG)
    for name, value in env.items():
        aws_config.env.setenv(name, value)
    found = deps.configured_endpoint(deps.session(profile), "s3")
    used = _client_endpoint(profile)
    if found is None:
        assert used.endswith(".amazonaws.com")
    else:
        assert found == used


def test_botocore_ignores_configured_endpoints_by_that_config_variable(aws_config):
    aws_config(CONFIG)
    aws_config.env.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert deps.session(None).get_config_variable("ignore_configured_endpoint_urls") is True
    assert _client_endpoint(None) == "https://s3.amazonaws.com"
    aws_config.env.delenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
    assert _client_endpoint(None, ignore_configured_endpoint_urls=True) == (
        "https://s3.amazonaws.com"
    )


def test_an_unknown_profile_is_a_botocore_error(aws_config):
    with pytest.raises(deps.Error, match="nowhere"):
        deps.configured_endpoint(deps.session("nowhere"), "s3")


def test_a_session_is_kept_while_what_it_reads_stays_the_same(aws_config):
    aws_config(CONFIG)
    first = deps.session("plain")
    assert deps.session("plain") is first  # a DataLoader worker inherits it
    assert deps.session("lab") is not first


def test_a_changed_config_file_or_variable_gets_a_new_session(aws_config):
    aws_config(CONFIG)
    before = deps.session("plain")
    assert before.get_config_variable("region") == "eu-west-3"
    aws_config(CONFIG.replace("eu-west-3", "eu-west-1"))  # the same size
    after = deps.session("plain")
    assert after is not before
    assert after.get_config_variable("region") == "eu-west-1"
    aws_config.env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9003")
    assert deps.session("plain") is not after
    assert deps.configured_endpoint(deps.session("plain"), "s3") == "http://127.0.0.1:9003"
