"""What the obstore option and transport tests share: a machine without cloud settings,
and the mapping's two answers asserted."""

from __future__ import annotations

import warnings

import aiohttp
import pytest

from fsspec_shards.storage.backends.obstore_options import StoreSpec, Unmappable, map_options
from tests.aws_config import RESOLVING

AZ_KEY = "a2V5LWZvci10ZXN0cw=="
SAS = "sv=2024-01-01&sp=r&se=2030-01-01&sig=S1gnatur3"
S3_ENDPOINT = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
SERVICE_ACCOUNT = {
    "type": "service_account",
    "client_email": "reader@project.iam.gserviceaccount.com",
    "private_key": "-----BEGIN PRIVATE KEY-----\nPRIVATE\n-----END PRIVATE KEY-----\n",
    "private_key_id": "abc",
    "token_uri": "https://oauth2.googleapis.com/token",
}
AZURITE_CS = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    f"AccountKey={AZ_KEY};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)


@pytest.fixture
def no_ambient_credentials(monkeypatch, tmp_path):
    """Mapping must not depend on the machine: no AWS/Azure/Google settings from outside."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        *RESOLVING,
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


def basic_auth(login: str, password: str) -> aiohttp.BasicAuth:
    """What fsspec's http users pass as ``client_kwargs["auth"]`` (deprecated in aiohttp 4)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return aiohttp.BasicAuth(login, password)


def spec_of(protocol: str, options: dict) -> StoreSpec:
    mapped = map_options(protocol, options)
    assert isinstance(mapped, StoreSpec), mapped
    return mapped


def refusal_of(protocol: str, options: dict) -> Unmappable:
    mapped = map_options(protocol, options)
    assert isinstance(mapped, Unmappable), mapped
    return mapped
