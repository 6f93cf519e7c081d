"""S3 (``storage/backends/s3.py``, ``s3_location.py``): its location (one resolution,
botocore's, for the cache key and the obstore store), its taming, and its obstore mapping."""

from __future__ import annotations

import fsspec
import pytest

from fsspec_shards.storage.backends import backend_for, backend_location, s3, s3_location
from fsspec_shards.storage.backends.obstore_options import StoreSpec, map_options
from fsspec_shards.storage.backends.s3 import BotocoreCredentials, StaticCredentials
from fsspec_shards.storage.backends.s3_location import Location
from tests.aws_config import aws_config_fixture  # noqa: F401 (the aws_config fixture)
from tests.obstore_helpers import (
    S3_ENDPOINT,
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytestmark = pytest.mark.usefixtures("no_ambient_credentials")
CONFIG = "[default]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:9001\n"


def _s3fs(**options):
    return fsspec.filesystem("s3", skip_instance_cache=True, anon=True, **options)


def test_the_config_files_endpoint_and_region_are_the_location(aws_config):
    aws_config(CONFIG)
    assert s3_location.resolve({}) == Location("http://127.0.0.1:9001", "eu-west-3", None)
    assert s3_location.resolve({"endpoint_url": "http://127.0.0.1:9009"}).endpoint == (
        "http://127.0.0.1:9009"
    )
    given = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9008", "region_name": "x"}}
    assert s3_location.resolve(given) == Location("http://127.0.0.1:9008", "x", None)


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
    assert s3_location.resolve(options) == Location(None, "eu-west-3", None)


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
    located = s3_location.resolve({})
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


def test_the_botocore_session_is_made_where_the_filesystem_is_made(aws_config, monkeypatch):
    """Made in the process that makes the filesystem (a DataLoader's main process: choosing
    the download transport resolves the obstore store's location), so that workers forked
    later inherit it; resolving the location at the first read then makes none, and still
    sees the config file of then."""
    import botocore.session

    aws_config(CONFIG)
    made: list[str | None] = []
    original = botocore.session.Session.__init__

    def counted(self, *args, **kwargs):
        made.append(kwargs.get("profile"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(botocore.session.Session, "__init__", counted)
    fs = fsspec.filesystem(
        "wds",
        target_protocol="s3",
        target_options={"anon": True},
        cache=False,
        skip_instance_cache=True,
    )
    assert made == [None]
    assert s3.located(fs.fs) == Location("http://127.0.0.1:9001", "eu-west-3", None)
    assert made == [None]
    aws_config("[default]\nendpoint_url = http://127.0.0.1:9005\n")
    assert s3.located(_s3fs()).endpoint == "http://127.0.0.1:9005"
    assert made == [None, None]


def test_botocore_option_names_listed_without_its_import_are_botocores():
    from botocore.config import Config
    from botocore.session import Session

    from fsspec_shards.storage.backends.base import parameters

    assert parameters(Session.create_client) - {"service_name"} == s3.BOTOCORE_CLIENT_OPTIONS
    assert set(Config.OPTION_DEFAULTS) == s3.BOTOCORE_CONFIG_OPTIONS


# --------------------------------------------------------------------------- taming


def test_s3_gets_one_botocore_attempt_and_socket_timeouts_unless_the_user_set_them():
    tamed = backend_for("s3").tamed_options({"anon": True}, timeout=7.0)
    config = tamed["config_kwargs"]
    assert config["retries"]["max_attempts"] == 1
    assert (config["connect_timeout"], config["read_timeout"]) == (7.0, 7.0)
    assert tamed["skip_instance_cache"] is True
    mine = {"config_kwargs": {"retries": {"max_attempts": 9}, "read_timeout": 3}}
    kept = backend_for("s3").tamed_options(mine, timeout=7.0)["config_kwargs"]
    assert kept["retries"] == {"max_attempts": 9} and kept["read_timeout"] == 3
    assert mine == {"config_kwargs": {"retries": {"max_attempts": 9}, "read_timeout": 3}}


def test_s3fs_instance_retries_once():
    s3 = fsspec.filesystem("s3", **backend_for("s3").tamed_options({"anon": True}, 5.0))
    backend_for("s3").tame_instance(s3)
    assert s3.retries == 1
    assert fsspec.filesystem("s3", anon=True).retries != 1  # the user's own instance is untouched


# --------------------------------------------------------------------------- obstore mapping


def test_s3_keys_become_static_credentials_with_the_session_token():
    spec = spec_of("s3", {"key": "AKID", "secret": "s3cr3t", "token": "t0k3n", **S3_ENDPOINT})
    assert isinstance(spec.credentials, StaticCredentials)
    assert spec.credentials() == {
        "access_key_id": "AKID",
        "secret_access_key": "s3cr3t",
        "token": "t0k3n",
        "expires_at": None,
    }
    assert spec.config["skip_signature"] is False
    assert set(spec.secrets) == {"s3cr3t", "t0k3n"}


@pytest.mark.parametrize(
    "options",
    [
        {"username": "AKID", "password": "s3cr3t"},
        {"client_kwargs": {"aws_access_key_id": "AKID", "aws_secret_access_key": "s3cr3t"}},
    ],
)
def test_s3_key_aliases_are_keys_too(options):
    spec = spec_of("s3", {**options, "endpoint_url": "https://minio.example"})
    assert spec.credentials()["access_key_id"] == "AKID"
    assert spec.credentials()["secret_access_key"] == "s3cr3t"


@pytest.mark.parametrize(
    "options",
    [
        {"endpoint_url": "http://127.0.0.1:9000"},
        {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}},
    ],
)
def test_an_s3_endpoint_is_set_explicitly_and_http_allowed(options):
    spec = spec_of("s3", {"anon": True, **options})
    assert spec.config["endpoint"] == "http://127.0.0.1:9000"
    assert spec.config["region"] == "us-east-1"
    assert spec.client == {"allow_http": True}


def test_an_https_s3_endpoint_does_not_allow_plain_http():
    spec = spec_of("s3", {"anon": True, "endpoint_url": "https://minio.example"})
    assert "allow_http" not in spec.client


def test_the_s3_region_names_the_aws_endpoint():
    spec = spec_of("s3", {"anon": True, "client_kwargs": {"region_name": "eu-west-3"}})
    assert spec.config["region"] == "eu-west-3"
    assert spec.config["endpoint"] == "https://s3.eu-west-3.amazonaws.com"
    assert not spec.bucket_region


def test_without_any_s3_region_the_bucket_is_asked_for_it():
    spec = spec_of("s3", {"anon": True})
    assert spec.bucket_region
    assert "endpoint" not in spec.config


def test_the_aws_region_is_botocores_default_region_not_aws_region(monkeypatch):
    """As s3fs: botocore reads AWS_DEFAULT_REGION; AWS_REGION is other SDKs' name."""
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert spec_of("s3", {"anon": True}).bucket_region
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert spec_of("s3", {"anon": True}).config["region"] == "ap-south-1"


def test_the_config_files_endpoint_and_region_hold_with_keys_given(monkeypatch, tmp_path):
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-3\nendpoint_url = http://10.0.0.2:9000\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    spec = spec_of("s3", {"key": "AKID", "secret": "s3cr3t"})
    assert (spec.config["endpoint"], spec.config["region"]) == ("http://10.0.0.2:9000", "eu-west-3")
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    spec = spec_of("s3", {"key": "AKID", "secret": "s3cr3t"})
    assert spec.config["endpoint"] == "https://s3.eu-west-3.amazonaws.com"


def test_a_services_section_names_the_s3_endpoint(monkeypatch, tmp_path):
    config = tmp_path / "config"
    config.write_text(
        "[profile lab]\nservices = lab-services\n"
        "[services lab-services]\ns3 =\n  endpoint_url = http://10.0.0.3:9000\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    spec = spec_of("s3", {"anon": True, "profile": "lab"})
    assert spec.config["endpoint"] == "http://10.0.0.3:9000"
    refused = refusal_of("s3", {"anon": True, "profile": "nowhere"})
    assert refused.option == "profile" and "nowhere" in refused.reason


def test_botocores_endpoint_environment_variable_is_honoured(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.1:9000")
    assert spec_of("s3", {"anon": True}).config["endpoint"] == "http://10.0.0.1:9000"


@pytest.mark.parametrize(
    "options",
    [{"anon": True}, {"config_kwargs": {"signature_version": "UNSIGNED"}}, {"anon": "true"}],
)
def test_anonymous_s3_skips_signing(options):
    spec = spec_of("s3", {**options, **S3_ENDPOINT})
    assert spec.config["skip_signature"] is True
    assert spec.credentials is None


def test_an_s3_profile_reads_botocores_files_and_its_region(monkeypatch, tmp_path):
    credentials = tmp_path / "credentials"
    credentials.write_text("[train]\naws_access_key_id = AKIDP\naws_secret_access_key = psecret\n")
    config = tmp_path / "config"
    config.write_text("[profile train]\nregion = eu-north-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    spec = spec_of("s3", {"profile": "train"})
    assert isinstance(spec.credentials, BotocoreCredentials)
    assert spec.credentials()["access_key_id"] == "AKIDP"
    assert spec.config["region"] == "eu-north-1"


def test_without_keys_s3_uses_botocores_credential_chain(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    spec = spec_of("s3", S3_ENDPOINT)
    assert isinstance(spec.credentials, BotocoreCredentials)
    assert spec.credentials()["secret_access_key"] == "envsecret"
    assert spec.credentials()["expires_at"] is not None  # re-read: refreshable credentials


def test_s3_without_any_credentials_is_refused():
    refusal = refusal_of("s3", S3_ENDPOINT)
    assert refusal.option == "key"
    assert "credential chain found none" in refusal.reason


def test_an_unknown_s3_profile_is_refused_by_name():
    assert refusal_of("s3", {"profile": "missing"}).option == "profile"


def test_s3_verify_false_allows_invalid_certificates():
    spec = spec_of("s3", {"anon": True, "client_kwargs": {"verify": False}})
    assert spec.client["allow_invalid_certificates"] is True


def test_an_s3_ca_bundle_becomes_the_root_certificate(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    spec = spec_of("s3", {"anon": True, "client_kwargs": {"verify": str(bundle)}})
    assert spec.client["root_certificate"] == bundle.read_bytes()


def test_an_unreadable_ca_bundle_is_refused(tmp_path):
    refusal = refusal_of("s3", {"anon": True, "client_kwargs": {"verify": str(tmp_path / "x")}})
    assert refusal.option == "client_kwargs.verify"


@pytest.mark.parametrize(
    "options",
    [{"requester_pays": True}, {"s3_additional_kwargs": {"RequestPayer": "requester"}}],
)
def test_requester_pays_is_carried_over(options):
    assert spec_of("s3", {"anon": True, **options}).config["request_payer"] is True


def test_virtual_host_addressing_on_aws_is_carried_over():
    spec = spec_of("s3", {"anon": True, "config_kwargs": {"s3": {"addressing_style": "virtual"}}})
    assert spec.config["virtual_hosted_style_request"] is True


def test_write_only_s3_settings_are_ignored():
    spec = spec_of(
        "s3",
        {"anon": True, "s3_additional_kwargs": {"ServerSideEncryption": "AES256"}, **S3_ENDPOINT},
    )
    assert spec.config["skip_signature"] is True


def test_the_tamed_s3_options_of_the_wds_filesystem_map():
    options = backend_for("s3").tamed_options({"key": "AKID", "secret": "s", **S3_ENDPOINT}, 30.0)
    assert isinstance(map_options("s3", options), StoreSpec)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"key": "AKID"}, "secret"),
        ({"secret": "s"}, "key"),
        ({"anon": True, "use_ssl": False}, "use_ssl"),
        ({"anon": True, "session": object()}, "session"),
        (
            {"anon": True, "s3_additional_kwargs": {"SSECustomerKey": "k"}},
            "s3_additional_kwargs.SSECustomerKey",
        ),
        (
            {"anon": True, "s3_additional_kwargs": {"Tagging": "a=b"}},
            "s3_additional_kwargs.Tagging",
        ),
        (
            {"anon": True, "config_kwargs": {"signature_version": "s3"}},
            "config_kwargs.signature_version",
        ),
        ({"anon": True, "config_kwargs": {"proxies": {"https": "p"}}}, "config_kwargs.proxies"),
        (
            {
                "anon": True,
                "endpoint_url": "https://x",
                "config_kwargs": {"s3": {"addressing_style": "virtual"}},
            },
            "config_kwargs.s3.addressing_style",
        ),
        ({"anon": True, "client_kwargs": {"config": object()}}, "client_kwargs.config"),
        ({"anon": "maybe"}, "anon"),
        ({"anon": True, "surprise": 1}, "surprise"),
    ],
)
def test_s3_options_without_an_obstore_equivalent_are_refused_by_name(options, option):
    assert refusal_of("s3", options).option == option


# --------------------------------------------------------------------------- the stand-in

STAND_IN_OPTIONS = [
    {},
    {"anon": True, "skip_instance_cache": True},
    {
        "key": "k",
        "secret": "s",
        "endpoint_url": "http://127.0.0.1:9000",
        "session_vars": {},
        "batch_size": 4,
        "use_listings_cache": False,
        "config_kwargs": {"read_timeout": 3},
    },
    {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9002", "region_name": "eu-west-3"}},
    {"profile": "stand-in", "anon": True},
]


@pytest.mark.parametrize("options", STAND_IN_OPTIONS)
def test_the_stand_in_answers_what_s3fs_would_without_building_it(aws_config, options):
    """What the cache key, the time-outs and the transport's choice read of the stand-in
    are s3fs's own, and reading them builds nothing (no import of s3fs)."""
    aws_config("[profile stand-in]\nregion = eu-west-2\n")
    real = fsspec.filesystem("s3", **options)
    stand_in = s3.UnbuiltS3FileSystem(options, lambda: pytest.fail("built"))
    for name in ("endpoint_url", "client_kwargs", "config_kwargs", "session", "kwargs"):
        assert getattr(stand_in, name) == getattr(real, name), name
    assert stand_in.asynchronous == real.asynchronous
    assert stand_in.storage_options == real.storage_options
    assert stand_in.protocol == real.protocol
    assert backend_for("s3").socket_timeouts(stand_in) == backend_for("s3").socket_timeouts(real)
    assert str(s3.located(stand_in)) == str(s3.located(real))
    stand_in.invalidate_cache("bucket/key")


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/a/b.tar",
        "s3a://bucket/a/b.tar",
        "s3://bucket/a/",
        "bucket/a//b.tar",
        "s3://bucket",
        "s3://",
        "s3://bucket/k.tar?versionId=abc",
        "s3://bucket/k.tar?x=1",
    ],
)
def test_the_stand_in_names_paths_as_s3fs(url):
    real = type(fsspec.filesystem("s3", anon=True))
    stand_in = s3.UnbuiltS3FileSystem
    assert stand_in._strip_protocol(url) == real._strip_protocol(url)
    assert stand_in._get_kwargs_from_urls(url) == real._get_kwargs_from_urls(url)
    path = real._strip_protocol(url)
    instance = s3.UnbuiltS3FileSystem({}, lambda: pytest.fail("built"))
    assert instance.unstrip_protocol(path) == fsspec.filesystem("s3").unstrip_protocol(path)


def test_anything_else_asked_of_the_stand_in_builds_s3fs_once():
    built = []

    def build():
        built.append(fsspec.filesystem("s3", anon=True, skip_instance_cache=True))
        return built[-1]

    stand_in = s3.UnbuiltS3FileSystem({"anon": True}, build)
    assert stand_in.split_path("bucket/key") == ("bucket", "key", None)
    assert stand_in.built() is built[0] and len(built) == 1
    assert stand_in.anon is True


def test_s3fs_parameters_listed_without_its_import_are_s3fss():
    from s3fs import S3FileSystem

    from fsspec_shards.storage.backends.base import parameters

    assert parameters(S3FileSystem.__init__) == s3.S3FS_PARAMETERS
