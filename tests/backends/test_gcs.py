"""GCS: its taming, its facts and its obstore mapping (``storage/backends/gcs.py``)."""

from __future__ import annotations

import json

import fsspec
import pytest

from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.backends.obstore_options import StoreSpec, map_options
from tests.obstore_helpers import (
    SERVICE_ACCOUNT,
    no_ambient_credentials,  # noqa: F401 - the fixture
    refusal_of,
    spec_of,
)

pytest.importorskip("obstore")
pytestmark = pytest.mark.usefixtures("no_ambient_credentials")


# --------------------------------------------------------------------------- taming


def test_gcsfs_instance_sends_requests_without_its_retry_decorator():
    gcs = fsspec.filesystem("gcs", **backend_for("gcs").tamed_options({"token": "anon"}, 5.0))
    backend_for("gcs").tame_instance(gcs)
    assert gcs._request.__func__ is type(gcs)._request.__wrapped__


# --------------------------------------------------------------------------- obstore mapping


def test_anonymous_gcs_at_an_emulator_endpoint():
    spec = spec_of("gcs", {"token": "anon", "endpoint_url": "http://127.0.0.1:4443/"})
    assert spec.config == {"base_url": "http://127.0.0.1:4443", "skip_signature": True}
    assert spec.client == {"allow_http": True}


def test_the_gcs_emulator_environment_variable_is_honoured(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert spec_of("gcs", {"token": "anon"}).config["base_url"] == "http://127.0.0.1:4443"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("STORAGE_EMULATOR_HOST", "default"),  # gcsfs: no emulator
        ("STORAGE_EMULATOR_HOST", "127.0.0.1:4443"),
        ("STORAGE_EMULATOR_HOST", "https://gcs.example:8443"),
        ("GOOGLE_CLOUD_UNIVERSE_DOMAIN", "example-universe.test"),
    ],
)
def test_obstore_goes_where_gcsfs_goes(monkeypatch, variable, value):
    # the cache key names gcsfs's endpoint: obstore must read from that one
    from fsspec_shards.storage.backends.gcs import GOOGLE
    from fsspec_shards.storage.deps import gcsfs as gcsfs_deps

    monkeypatch.setenv(variable, value)
    gcsfs_goes_to = gcsfs_deps.endpoint(fsspec.filesystem("gcs", token="anon"))
    assert spec_of("gcs", {"token": "anon"}).config.get("base_url", GOOGLE) == gcsfs_goes_to


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
    given = {"token": "anon", "endpoint_url": "http://h:1"}
    options = backend_for("gcs").tamed_options(given, 30.0)
    assert isinstance(map_options("gcs", options), StoreSpec)


def test_a_gcsfs_without_the_undecorated_request_is_warned_of(caplog):
    class Changed:
        async def _request(self):
            """No ``__wrapped__``: gcsfs moved its retries."""

    backend_for("gcs").tame_instance(Changed())
    assert "gcsfs changed: cannot turn down its own retries" in caplog.text
