"""The mapping of fsspec backend options onto obstore stores, and the transport choice.

Every supported option has a row that checks what it becomes; every refused one a row that
checks the refusal names it. Requests against real servers are in
tests/integration/test_obstore_transport.py.
"""

from __future__ import annotations

import json
import logging
import pickle
import warnings

import aiohttp
import pytest

from fsspec_shards.storage.backends import tamed_target_options
from fsspec_shards.storage.obstore_transport import (
    HttpStatusError,
    ObstoreTransport,
    StoreSpec,
    Unmappable,
    _BotocoreCredentials,
    _StaticCredentials,
    choose_transport,
    map_options,
)
from fsspec_shards.storage.retry import is_transient
from fsspec_shards.storage.versions import VersionMismatch

pytest.importorskip("obstore")

AZ_KEY = "a2V5LWZvci10ZXN0cw=="
SAS = "sv=2024-01-01&sp=r&se=2030-01-01&sig=S1gnatur3"


@pytest.fixture(autouse=True)
def _no_ambient_credentials(monkeypatch, tmp_path):
    """Mapping must not depend on the machine: no AWS/Azure/Google settings from outside."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_ANON",
        "STORAGE_EMULATOR_HOST",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-google-file.json"))


def _basic_auth(login: str, password: str) -> aiohttp.BasicAuth:
    """What fsspec's http users pass as ``client_kwargs["auth"]`` (deprecated in aiohttp 4)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return aiohttp.BasicAuth(login, password)


def _spec(protocol: str, options: dict) -> StoreSpec:
    mapped = map_options(protocol, options)
    assert isinstance(mapped, StoreSpec), mapped
    return mapped


def _refusal(protocol: str, options: dict) -> Unmappable:
    mapped = map_options(protocol, options)
    assert isinstance(mapped, Unmappable), mapped
    return mapped


# --------------------------------------------------------------------------- s3

S3_ENDPOINT = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}


def test_s3_keys_become_static_credentials_with_the_session_token():
    spec = _spec("s3", {"key": "AKID", "secret": "s3cr3t", "token": "t0k3n", **S3_ENDPOINT})
    assert isinstance(spec.credentials, _StaticCredentials)
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
    spec = _spec("s3", {**options, "endpoint_url": "https://minio.example"})
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
    spec = _spec("s3", {"anon": True, **options})
    assert spec.config["endpoint"] == "http://127.0.0.1:9000"
    assert spec.config["region"] == "us-east-1"
    assert spec.client == {"allow_http": True}


def test_an_https_s3_endpoint_does_not_allow_plain_http():
    spec = _spec("s3", {"anon": True, "endpoint_url": "https://minio.example"})
    assert "allow_http" not in spec.client


def test_the_s3_region_names_the_aws_endpoint():
    spec = _spec("s3", {"anon": True, "client_kwargs": {"region_name": "eu-west-3"}})
    assert spec.config["region"] == "eu-west-3"
    assert spec.config["endpoint"] == "https://s3.eu-west-3.amazonaws.com"
    assert not spec.bucket_region


def test_without_any_s3_region_the_bucket_is_asked_for_it():
    spec = _spec("s3", {"anon": True})
    assert spec.bucket_region
    assert "endpoint" not in spec.config


def test_the_aws_region_environment_variable_is_honoured(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert _spec("s3", {"anon": True}).config["region"] == "ap-south-1"


def test_botocores_endpoint_environment_variable_is_honoured(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.1:9000")
    assert _spec("s3", {"anon": True}).config["endpoint"] == "http://10.0.0.1:9000"


@pytest.mark.parametrize(
    "options",
    [{"anon": True}, {"config_kwargs": {"signature_version": "UNSIGNED"}}, {"anon": "true"}],
)
def test_anonymous_s3_skips_signing(options):
    spec = _spec("s3", {**options, **S3_ENDPOINT})
    assert spec.config["skip_signature"] is True
    assert spec.credentials is None


def test_an_s3_profile_reads_botocores_files_and_its_region(monkeypatch, tmp_path):
    credentials = tmp_path / "credentials"
    credentials.write_text("[train]\naws_access_key_id = AKIDP\naws_secret_access_key = psecret\n")
    config = tmp_path / "config"
    config.write_text("[profile train]\nregion = eu-north-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    spec = _spec("s3", {"profile": "train"})
    assert isinstance(spec.credentials, _BotocoreCredentials)
    assert spec.credentials()["access_key_id"] == "AKIDP"
    assert spec.config["region"] == "eu-north-1"


def test_without_keys_s3_uses_botocores_credential_chain(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    spec = _spec("s3", S3_ENDPOINT)
    assert isinstance(spec.credentials, _BotocoreCredentials)
    assert spec.credentials()["secret_access_key"] == "envsecret"
    assert spec.credentials()["expires_at"] is not None  # re-read: refreshable credentials


def test_s3_without_any_credentials_is_refused():
    refusal = _refusal("s3", S3_ENDPOINT)
    assert refusal.option == "key"
    assert "credential chain found none" in refusal.reason


def test_an_unknown_s3_profile_is_refused_by_name():
    assert _refusal("s3", {"profile": "missing"}).option == "profile"


def test_s3_verify_false_allows_invalid_certificates():
    spec = _spec("s3", {"anon": True, "client_kwargs": {"verify": False}})
    assert spec.client["allow_invalid_certificates"] is True


def test_an_s3_ca_bundle_becomes_the_root_certificate(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    spec = _spec("s3", {"anon": True, "client_kwargs": {"verify": str(bundle)}})
    assert spec.client["root_certificate"] == bundle.read_bytes()


def test_an_unreadable_ca_bundle_is_refused(tmp_path):
    refusal = _refusal("s3", {"anon": True, "client_kwargs": {"verify": str(tmp_path / "x")}})
    assert refusal.option == "client_kwargs.verify"


@pytest.mark.parametrize(
    "options",
    [{"requester_pays": True}, {"s3_additional_kwargs": {"RequestPayer": "requester"}}],
)
def test_requester_pays_is_carried_over(options):
    assert _spec("s3", {"anon": True, **options}).config["request_payer"] is True


def test_virtual_host_addressing_on_aws_is_carried_over():
    spec = _spec("s3", {"anon": True, "config_kwargs": {"s3": {"addressing_style": "virtual"}}})
    assert spec.config["virtual_hosted_style_request"] is True


def test_write_only_s3_settings_are_ignored():
    spec = _spec(
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
    assert _refusal("s3", options).option == option


# --------------------------------------------------------------------------- gcs


def test_anonymous_gcs_at_an_emulator_endpoint():
    spec = _spec("gcs", {"token": "anon", "endpoint_url": "http://127.0.0.1:4443/"})
    assert spec.config == {"base_url": "http://127.0.0.1:4443", "skip_signature": True}
    assert spec.client == {"allow_http": True}


def test_the_gcs_emulator_environment_variable_is_honoured(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert _spec("gcs", {"token": "anon"}).config["base_url"] == "http://127.0.0.1:4443"


SERVICE_ACCOUNT = {
    "type": "service_account",
    "client_email": "reader@project.iam.gserviceaccount.com",
    "private_key": "-----BEGIN PRIVATE KEY-----\nPRIVATE\n-----END PRIVATE KEY-----\n",
    "private_key_id": "abc",
    "token_uri": "https://oauth2.googleapis.com/token",
}


def test_a_gcs_service_account_dict_becomes_the_service_account_key():
    spec = _spec("gcs", {"token": SERVICE_ACCOUNT, "project": "p", "access": "read_only"})
    assert json.loads(spec.config["service_account_key"]) == SERVICE_ACCOUNT
    assert SERVICE_ACCOUNT["private_key"] in spec.secrets


def test_a_gcs_service_account_file_becomes_the_service_account_key(tmp_path):
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(SERVICE_ACCOUNT))
    spec = _spec("gcs", {"token": str(path)})
    assert json.loads(spec.config["service_account_key"]) == SERVICE_ACCOUNT


def test_gcs_user_credentials_become_a_google_auth_provider():
    user = {
        "type": "authorized_user",
        "client_id": "id",
        "client_secret": "csecret",
        "refresh_token": "rtoken",
    }
    spec = _spec("gcs", {"token": user})
    assert spec.credentials is not None
    assert {"csecret", "rtoken"} <= set(spec.secrets)


def test_gcs_default_credentials_missing_are_refused():
    refusal = _refusal("gcs", {})
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
    assert _refusal("gcs", options).option == option


def test_the_tamed_gcs_options_of_the_wds_filesystem_map():
    options = tamed_target_options("gcs", {"token": "anon", "endpoint_url": "http://h:1"}, 30.0)
    assert isinstance(map_options("gcs", options), StoreSpec)


# --------------------------------------------------------------------------- azure

AZURITE_CS = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    f"AccountKey={AZ_KEY};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)


def test_an_azure_connection_string_gives_endpoint_account_and_key():
    spec = _spec("az", {"connection_string": AZURITE_CS})
    assert spec.config["account_name"] == "devstoreaccount1"
    assert spec.config["endpoint"] == "http://127.0.0.1:10000/devstoreaccount1"
    assert spec.config["access_key"] == AZ_KEY
    assert spec.config["credential_type"] == "access_key"
    assert spec.client == {"allow_http": True}
    assert AZ_KEY in spec.secrets


def test_an_azure_connection_string_with_a_sas_and_no_blob_endpoint():
    spec = _spec(
        "abfs",
        {"connection_string": f"AccountName=acct;SharedAccessSignature={SAS};EndpointSuffix=x.y"},
    )
    assert spec.config["endpoint"] == "https://acct.blob.x.y"
    assert spec.config["sas_key"] == SAS
    assert spec.config["credential_type"] == "sas_token"


def test_azure_development_storage_is_azurite():
    spec = _spec("az", {"connection_string": "UseDevelopmentStorage=true"})
    assert spec.config["endpoint"] == "http://127.0.0.1:10000/devstoreaccount1"


def test_an_azure_account_key():
    spec = _spec("az", {"account_name": "acct", "account_key": AZ_KEY})
    assert spec.config["endpoint"] == "https://acct.blob.core.windows.net"
    assert spec.config["access_key"] == AZ_KEY


def test_an_azure_account_host_is_the_endpoint():
    spec = _spec("az", {"account_name": "acct", "account_key": AZ_KEY, "account_host": "h.example"})
    assert spec.config["endpoint"] == "https://h.example"


def test_an_azure_sas_token_loses_its_question_mark():
    spec = _spec("az", {"account_name": "acct", "sas_token": "?" + SAS})
    assert spec.config["sas_key"] == SAS
    assert SAS in spec.secrets


def test_an_azure_service_principal():
    spec = _spec(
        "az", {"account_name": "acct", "client_id": "c", "client_secret": "cs", "tenant_id": "t"}
    )
    assert spec.config["credential_type"] == "client_secret"
    assert "cs" in spec.secrets


def test_anonymous_azure_skips_signing():
    assert _spec("az", {"account_name": "acct", "anon": True}).config["skip_signature"] is True


def test_azure_settings_come_from_the_environment_as_adlfs_reads_them(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "envacct")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZ_KEY)
    spec = _spec("az", {})
    assert spec.config["account_name"] == "envacct"
    assert spec.config["access_key"] == AZ_KEY


def test_an_azure_key_given_as_credential_string_is_a_key():
    spec = _spec("az", {"account_name": "acct", "credential": AZ_KEY})
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
    assert _refusal("az", options).option == option


# --------------------------------------------------------------------------- http


def test_http_headers_and_basic_auth_become_default_headers():
    spec = _spec(
        "https",
        {
            "headers": {"X-Team": "a"},
            "client_kwargs": {
                "headers": {"X-Run": "b"},
                "auth": _basic_auth("user", "pa55"),
                "trust_env": True,
            },
        },
    )
    headers = spec.client["default_headers"]
    assert headers["X-Team"] == "a" and headers["X-Run"] == "b"
    assert headers["Authorization"].startswith("Basic ")
    assert "pa55" in spec.secrets
    assert headers["Authorization"].split()[1] in spec.secrets


def test_http_ssl_false_allows_invalid_certificates():
    assert _spec("https", {"ssl": False}).client == {"allow_invalid_certificates": True}


def test_the_tamed_http_options_of_the_wds_filesystem_map():
    assert _spec("http", tamed_target_options("http", {}, 30.0)).client == {}


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
    assert _refusal("http", options).option == option


# --------------------------------------------------------------------------- choice


@pytest.mark.parametrize("protocol", ["file", "memory", "ftp", "hf"])
def test_protocols_without_an_obstore_store_are_refused(protocol):
    assert _refusal(protocol, {}).option == "target_protocol"


def test_transport_fsspec_never_uses_obstore():
    assert choose_transport("s3", {"anon": True}, "fsspec") is None


def test_transport_auto_uses_obstore_when_the_options_map():
    assert isinstance(choose_transport("s3", {"anon": True}, "auto"), ObstoreTransport)


def test_transport_auto_falls_back_to_fsspec_and_says_why_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger="fsspec_shards.storage.obstore_transport"):
        assert choose_transport("s3", {"anon": True, "session": object()}, "auto") is None
    assert "session" in caplog.text


def test_transport_obstore_raises_naming_the_option():
    with pytest.raises(ValueError, match="'client_kwargs.connector'"):
        choose_transport("http", {"client_kwargs": {"connector": object()}}, "obstore")


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="transport must be one of auto, obstore, fsspec"):
        choose_transport("s3", {}, "rust")


@pytest.mark.parametrize(
    ("protocol", "options", "secret"),
    [
        ("s3", {"key": "AKID", "secret": "s3cr3tvalue", **S3_ENDPOINT}, "s3cr3tvalue"),
        ("az", {"connection_string": AZURITE_CS}, AZ_KEY),
        ("az", {"account_name": "acct", "sas_token": SAS}, "S1gnatur3"),
        ("gcs", {"token": SERVICE_ACCOUNT}, "PRIVATE"),
        ("http", {"client_kwargs": {"auth": _basic_auth("u", "pa55word")}}, "pa55word"),
    ],
)
def test_no_secret_shows_in_a_spec_or_a_transport(protocol, options, secret):
    spec = _spec(protocol, options)
    transport = ObstoreTransport(protocol, spec)
    for text in (repr(spec), str(spec), spec.shown, repr(transport), spec.key):
        assert secret not in text


def test_a_refusal_shows_no_secret():
    refusal = _refusal("az", {"connection_string": AZURITE_CS, "surprise": "x"})
    assert AZ_KEY not in str(refusal)


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("protocol", "options", "path", "reason"),
    [
        ("http", {}, "http://h/a?sig=x", "query"),
        ("http", {}, "http://user:pw@h/a", "credentials"),
        ("s3", {"anon": True}, "bucket/a//b", "cannot address"),
        ("s3", {"anon": True}, "bucket/", "cannot address"),
        ("gcs", {"token": "anon"}, "bucket/a#123", "query or fragment"),
        ("az", {"account_name": "a", "anon": True}, "container/a/../b", "cannot address"),
    ],
)
def test_paths_obstore_cannot_address_are_left_to_fsspec(protocol, options, path, reason):
    transport = ObstoreTransport(protocol, _spec(protocol, options))
    assert reason in transport.unserved_reason(path)
    assert "pw" not in transport.unserved_reason(path)


@pytest.mark.parametrize(
    ("protocol", "options", "path", "located"),
    [
        ("s3", {"anon": True}, "bucket/a/b.tar", ("bucket", "a/b.tar", None)),
        ("s3", {"anon": True}, "s3://bucket/a/b.tar", ("bucket", "a/b.tar", None)),
        ("s3", {"anon": True}, "bucket/a.tar?versionId=v7", ("bucket", "a.tar", "v7")),
        ("http", {}, "http://h:81/d/a%20b.tar", ("http://h:81", "d/a b.tar", None)),
        ("az", {"account_name": "a", "anon": True}, "c/x.tar", ("c", "x.tar", None)),
    ],
)
def test_paths_split_into_store_and_key(protocol, options, path, located):
    transport = ObstoreTransport(protocol, _spec(protocol, options))
    assert transport.unserved_reason(path) is None
    assert transport._locate(path) == located


def test_equal_options_share_stores_and_other_keys_do_not():
    options = {"key": "AKID", "secret": "one", **S3_ENDPOINT}
    assert _spec("s3", options).key == _spec("s3", dict(options)).key
    assert _spec("s3", options).key != _spec("s3", {**options, "secret": "two"}).key


def test_errors_keep_their_status_across_processes():
    """Failures cross process boundaries (dask, multiprocessing) and must stay classified."""
    for error in (HttpStatusError(503, "GET x: 503"), VersionMismatch(116, "x changed")):
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy)) == (type(error), str(error))
        assert getattr(copy, "status", None) == getattr(error, "status", None)
        assert is_transient(copy) is is_transient(error)
