"""A backend option the backend does not take is an error naming it (backend_options)."""

from __future__ import annotations

import pytest

from fsspec_shards.errors import OptionError
from fsspec_shards.storage.backends.accepted_options import (
    accepted_options,
    check_backend_options,
    introspected_options,
)


def test_a_misspelt_s3_option_is_named_with_the_one_meant():
    with pytest.raises(OptionError, match=r"s3\.endpoint_urll.*did you mean 'endpoint_url'") as e:
        check_backend_options("s3", {"endpoint_urll": "http://x", "key": "k"})
    assert e.value.option == "s3.endpoint_urll"
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    ("protocol", "options"),
    [
        ("s3", {"key": "k", "client_kwargs": {}, "profile": "p", "skip_instance_cache": True}),
        ("gcs", {"token": "anon", "endpoint_url": "http://x", "project": "p"}),
        ("https", {"headers": {"a": "b"}, "client_kwargs": {"trust_env": True}, "ssl": False}),
        ("file", {"auto_mkdir": True, "use_listings_cache": False}),
    ],
)
def test_what_each_backend_takes_passes(protocol, options):
    check_backend_options(protocol, options)


def test_the_rest_of_s3s_options_are_aiobotocores_session_and_https_aiohttps_request():
    assert {"profile", "session_vars"} <= accepted_options("s3")
    assert {"headers", "auth", "ssl"} <= accepted_options("http")


def test_backends_whose_leftovers_go_elsewhere_are_not_checked():
    assert accepted_options("abfs") is None
    check_backend_options("abfs", {"exclude_cli_credential": True})
    check_backend_options("memory", {"anything": 1})


def test_tables_of_a_clients_keywords_are_checked_against_that_client():
    with pytest.raises(OptionError, match=r"s3\.client_kwargs\.endpoint\b.*'endpoint_url'"):
        check_backend_options("s3", {"client_kwargs": {"endpoint": "http://h"}})
    with pytest.raises(OptionError, match=r"s3\.config_kwargs\.read_timout"):
        check_backend_options("s3", {"config_kwargs": {"read_timout": 5}})
    check_backend_options(
        "s3", {"client_kwargs": {"region_name": "x"}, "config_kwargs": {"read_timeout": 5}}
    )
    with pytest.raises(OptionError, match=r"https\.client_kwargs\.trust_envv"):
        check_backend_options("https", {"client_kwargs": {"trust_envv": True}})


def test_s3s_options_listed_without_importing_s3fs_are_what_its_classes_take():
    assert accepted_options("s3") == introspected_options("s3")
