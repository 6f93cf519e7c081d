"""The mapping of fsspec backend options onto obstore store configurations.

Every supported option has a row that checks what it becomes; every refused one a row that
checks the refusal names it.
"""

from __future__ import annotations

import json

import pytest

from fsspec_shards.storage.backends import tamed_target_options
from fsspec_shards.storage.backends.s3 import BotocoreCredentials, StaticCredentials
from fsspec_shards.storage.obstore_options import StoreSpec, map_options
from tests.obstore_helpers import (
    AZ_KEY,
    AZURITE_CS,
    S3_ENDPOINT,
    SAS,
    SERVICE_ACCOUNT,
    basic_auth,
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytest.importorskip("obstore")
pytestmark = pytest.mark.usefixtures("no_ambient_credentials")


# --------------------------------------------------------------------------- s3


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
    options = tamed_target_options("s3", {"key": "AKID", "secret": "s", **S3_ENDPOINT}, 30.0)
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


# --------------------------------------------------------------------------- gcs


def test_anonymous_gcs_at_an_emulator_endpoint():
    spec = spec_of("gcs", {"token": "anon", "endpoint_url": "http://127.0.0.1:4443/"})
    assert spec.config == {"base_url": "http://127.0.0.1:4443", "skip_signature": True}
    assert spec.client == {"allow_http": True}


def test_the_gcs_emulator_environment_variable_is_honoured(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert spec_of("gcs", {"token": "anon"}).config["base_url"] == "http://127.0.0.1:4443"


def test_a_gcs_service_account_dict_becomes_the_service_account_key():
    spec = spec_of("gcs", {"token": SERVICE_ACCOUNT, "project": "p", "access": "read_only"})
    assert json.loads(spec.config["service_account_key"]) == SERVICE_ACCOUNT
    assert SERVICE_ACCOUNT["private_key"] in spec.secrets


def test_a_gcs_service_account_file_becomes_the_service_account_key(tmp_path):
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(SERVICE_ACCOUNT))
    spec = spec_of("gcs", {"token": str(path)})
    assert json.loads(spec.config["service_account_key"]) == SERVICE_ACCOUNT


def test_gcs_user_credentials_become_a_google_auth_provider():
    user = {
        "type": "authorized_user",
        "client_id": "id",
        "client_secret": "csecret",
        "refresh_token": "rtoken",
    }
    spec = spec_of("gcs", {"token": user})
    assert spec.credentials is not None
    assert {"csecret", "rtoken"} <= set(spec.secrets)


def test_gcs_default_credentials_missing_are_refused():
    refusal = refusal_of("gcs", {})
    assert refusal.option == "token"
    assert "DefaultCredentialsError" in refusal.reason


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"token": "browser"}, "token"),
        ({"token": 42}, "token"),
        ({"token": "/no/such/file.json"}, "token"),
        ({"token": "anon", "requester_pays": True}, "requester_pays"),
        ({"token": "anon", "session_kwargs": {"trust_env": True}}, "session_kwargs"),
        ({"token": "anon", "unknown": 1}, "unknown"),
    ],
)
def test_gcs_options_without_an_obstore_equivalent_are_refused_by_name(options, option):
    assert refusal_of("gcs", options).option == option


def test_the_tamed_gcs_options_of_the_wds_filesystem_map():
    options = tamed_target_options("gcs", {"token": "anon", "endpoint_url": "http://h:1"}, 30.0)
    assert isinstance(map_options("gcs", options), StoreSpec)


# --------------------------------------------------------------------------- azure


def test_an_azure_connection_string_gives_endpoint_account_and_key():
    spec = spec_of("az", {"connection_string": AZURITE_CS})
    assert spec.config["account_name"] == "devstoreaccount1"
    assert spec.config["endpoint"] == "http://127.0.0.1:10000/devstoreaccount1"
    assert spec.config["access_key"] == AZ_KEY
    assert spec.config["credential_type"] == "access_key"
    assert spec.client == {"allow_http": True}
    assert AZ_KEY in spec.secrets


def test_an_azure_connection_string_with_a_sas_and_no_blob_endpoint():
    spec = spec_of(
        "abfs",
        {"connection_string": f"AccountName=acct;SharedAccessSignature={SAS};EndpointSuffix=x.y"},
    )
    assert spec.config["endpoint"] == "https://acct.blob.x.y"
    assert spec.config["sas_key"] == SAS
    assert spec.config["credential_type"] == "sas_token"


def test_azure_development_storage_is_azurite():
    spec = spec_of("az", {"connection_string": "UseDevelopmentStorage=true"})
    assert spec.config["endpoint"] == "http://127.0.0.1:10000/devstoreaccount1"


def test_an_azure_account_key():
    spec = spec_of("az", {"account_name": "acct", "account_key": AZ_KEY})
    assert spec.config["endpoint"] == "https://acct.blob.core.windows.net"
    assert spec.config["access_key"] == AZ_KEY


def test_an_azure_account_host_is_the_endpoint():
    spec = spec_of(
        "az", {"account_name": "acct", "account_key": AZ_KEY, "account_host": "h.example"}
    )
    assert spec.config["endpoint"] == "https://h.example"


def test_an_azure_sas_token_loses_its_question_mark():
    spec = spec_of("az", {"account_name": "acct", "sas_token": "?" + SAS})
    assert spec.config["sas_key"] == SAS
    assert SAS in spec.secrets


def test_an_azure_service_principal():
    spec = spec_of(
        "az", {"account_name": "acct", "client_id": "c", "client_secret": "cs", "tenant_id": "t"}
    )
    assert spec.config["credential_type"] == "client_secret"
    assert "cs" in spec.secrets


def test_anonymous_azure_skips_signing():
    assert spec_of("az", {"account_name": "acct", "anon": True}).config["skip_signature"] is True


def test_azure_settings_come_from_the_environment_as_adlfs_reads_them(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY)
    spec = spec_of("az", {})
    assert spec.config["account_name"] == "envacct"
    assert spec.config["access_key"] == AZ_KEY


def test_an_azure_key_given_as_credential_string_is_a_key():
    spec = spec_of("az", {"account_name": "acct", "credential": AZ_KEY})
    assert spec.config["access_key"] == AZ_KEY


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"account_name": "acct"}, "account_name"),
        ({}, "account_name"),
        ({"account_name": "acct", "credential": object()}, "credential"),
        ({"account_name": "acct", "anon": True, "location_mode": "secondary"}, "location_mode"),
        ({"account_name": "acct", "anon": True, "request_session": object()}, "request_session"),
        ({"connection_string": "garbage"}, "connection_string"),
        ({"account_name": "acct", "anon": True, "unknown": 1}, "unknown"),
    ],
)
def test_azure_options_without_an_obstore_equivalent_are_refused_by_name(options, option):
    assert refusal_of("az", options).option == option


# --------------------------------------------------------------------------- http


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
    assert spec_of("http", tamed_target_options("http", {}, 30.0)).client == {}


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
