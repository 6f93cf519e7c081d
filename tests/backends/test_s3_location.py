"""Where an S3 configuration's requests go (``storage/backends/s3_location.py``): found
without botocore where the environment alone decides it, and then botocore's answer."""

from __future__ import annotations

import itertools
import sys
from collections import ChainMap

import pytest

from fsspec_shards.storage.backends.s3_location import (
    Location,
    botocore_location,
    environment_location,
    resolve,
)
from tests.obstore_helpers import (
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytestmark = pytest.mark.usefixtures("no_ambient_credentials")

ENDPOINT_VARIABLES = [
    {},
    {"AWS_ENDPOINT_URL_S3": ""},
    {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9003"},
    {"AWS_ENDPOINT_URL": "http://127.0.0.1:9004"},
    {"AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": "http://127.0.0.1:9004"},
    {"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9003", "AWS_ENDPOINT_URL": "http://127.0.0.1:9004"},
]
IGNORING_VARIABLES = [
    {},
    {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": ""},
    {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "TRUE"},
    {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "false"},
]
REGION_VARIABLES = [
    {},
    {"AWS_DEFAULT_REGION": ""},
    {"AWS_DEFAULT_REGION": "eu-west-1"},
    {"AWS_REGION": "ap-south-1"},  # not botocore's
]
LOCATION_OPTIONS = [
    {},
    {"endpoint_url": "http://127.0.0.1:9009"},
    {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9008", "region_name": "x"}},
    {"config_kwargs": {"ignore_configured_endpoint_urls": True, "region_name": "c"}},
    {"config_kwargs": {"ignore_configured_endpoint_urls": False}},
    {"profile": None, "session": None},
]


@pytest.fixture(name="no_aws_files")
def no_aws_files_fixture(monkeypatch, tmp_path):
    """A home without ``~/.aws`` and no variable naming a config file: where botocore reads
    nothing but the environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AWS_CONFIG_FILE")
    monkeypatch.delenv("AWS_SHARED_CREDENTIALS_FILE")
    return monkeypatch


def test_where_the_environment_alone_decides_the_location_is_botocores(no_aws_files):
    """The location found without botocore is the one a botocore session resolves, over a
    matrix of the variables botocore reads (and one it does not) and of the options."""
    compared = 0
    for variables in itertools.product(ENDPOINT_VARIABLES, IGNORING_VARIABLES, REGION_VARIABLES):
        with no_aws_files.context() as env:
            for name, value in ChainMap(*variables).items():
                env.setenv(name, value)
            for options in LOCATION_OPTIONS:
                found = environment_location(options)
                assert found is not None, (variables, options)
                assert found == botocore_location(options), (variables, options)
                compared += 1
    assert compared == 6 * 4 * 4 * len(LOCATION_OPTIONS)


@pytest.mark.parametrize("file", ["", "missing", "directory"])
def test_a_config_file_variable_naming_no_file_leaves_the_environment_deciding(
    no_aws_files, tmp_path, file
):
    named = {"": "", "missing": str(tmp_path / "missing"), "directory": str(tmp_path)}[file]
    no_aws_files.setenv("AWS_CONFIG_FILE", named)
    no_aws_files.setenv("AWS_SHARED_CREDENTIALS_FILE", named)
    no_aws_files.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    found = environment_location({})
    assert found == botocore_location({}) == Location(None, "eu-west-1", None)


REGION_FILE = "[default]\nregion = eu-central-1\n"


@pytest.mark.parametrize(
    "case",
    [
        "~/.aws/config",
        "~/.aws/credentials",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE with a variable",
    ],
)
def test_a_config_file_where_botocore_reads_one_asks_botocore(no_aws_files, tmp_path, case):
    """A file botocore would read (the credentials file's profiles count as the config
    file's, region included) leaves the answer to botocore."""
    name = case.split()[0]
    if name.startswith("~"):
        path = tmp_path / ".aws" / name.rsplit("/", 1)[1]
        path.parent.mkdir()
    else:
        path = tmp_path / "aws-file"
        shown = "$AWS_FILES/aws-file" if "variable" in case else str(path)
        no_aws_files.setenv("AWS_FILES", str(tmp_path))
        no_aws_files.setenv(name, shown)
    path.write_text(REGION_FILE)
    assert environment_location({}) is None
    assert resolve({}) == Location(None, "eu-central-1", None)


@pytest.mark.parametrize(
    "variables, options",
    [
        ({"AWS_PROFILE": "p"}, {}),
        ({"AWS_DEFAULT_PROFILE": "p"}, {}),
        ({"AWS_PROFILE": ""}, {}),
        ({}, {"profile": "p"}),
        ({}, {"profile": ""}),
    ],
)
def test_a_profile_named_asks_botocore(no_aws_files, variables, options):
    for name, value in variables.items():
        no_aws_files.setenv(name, value)
    assert environment_location(options) is None
    with pytest.raises(Exception, match="could not be found"):
        resolve(options)  # no such profile: botocore's error, as s3fs would raise it


def test_a_session_given_is_asked(no_aws_files):
    from fsspec_shards.storage.deps import botocore as botocore_deps

    session = botocore_deps.session(None)
    assert environment_location({"session": session}) is None
    assert resolve({"session": session}) == Location(None, None, None)


def test_the_environment_alone_makes_no_botocore_session(no_aws_files, monkeypatch):
    import botocore.session

    made = []
    original = botocore.session.Session.__init__

    def counted(self, *args, **kwargs):
        made.append(kwargs.get("profile"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(botocore.session.Session, "__init__", counted)
    no_aws_files.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    given = {"key": "AKID", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:1"}}
    assert resolve(given) == Location("http://h:1", "eu-west-1", None)
    spec = spec_of("s3", given)
    assert (spec.config["endpoint"], spec.config["region"]) == ("http://h:1", "eu-west-1")
    assert made == []


def test_without_botocore_only_a_location_botocore_must_resolve_is_refused(
    no_aws_files, monkeypatch
):
    monkeypatch.setitem(sys.modules, "fsspec_shards.storage.deps.botocore", None)
    given = {"key": "AKID", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:1"}}
    assert spec_of("s3", given).config["endpoint"] == "http://h:1"
    refusal = refusal_of("s3", {**given, "profile": "p"})
    assert (refusal.option, refusal.reason) == (
        "target_protocol",
        "botocore is not installed to resolve the endpoint",
    )
