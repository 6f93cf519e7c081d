"""Azure: its taming, its facts and its obstore mapping (``storage/backends/azure.py``)."""

from __future__ import annotations

import fsspec
import pytest

from fsspec_shards.storage.backends import backend_for
from tests.obstore_helpers import (
    AZ_KEY,
    AZURITE_CS,
    SAS,
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytestmark = pytest.mark.usefixtures("no_ambient_credentials")
AZURITE = AZURITE_CS


# --------------------------------------------------------------------------- taming


def test_azure_sdk_retries_are_off():
    options = backend_for("az").tamed_options({"connection_string": AZURITE}, 5.0)
    az = fsspec.filesystem("az", **options)
    backend_for("az").tame_instance(az)
    assert az.service_client._config.retry_policy.total_retries == 0


# --------------------------------------------------------------------------- obstore mapping


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


def test_an_sdk_without_the_retry_policy_is_warned_of(caplog):
    class Changed:
        service_client = None

    backend_for("az").tame_instance(Changed())
    assert "cannot turn down the Azure SDK's own retries" in caplog.text
