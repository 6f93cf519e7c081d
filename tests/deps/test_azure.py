"""azure-storage-blob's and azure-core's private parts we use (``storage/deps/azure.py``):
these fail when the SDK changes them. The raw download runs against Azurite in
tests/integration."""

from __future__ import annotations

import inspect

import fsspec
from azure.storage.blob._generated.aio.operations import BlobOperations

from fsspec_shards.storage.deps import azure as deps
from tests.deps.test_adlfs import AZURITE


def test_the_retry_policy_is_where_we_turn_it_down():
    fs = fsspec.filesystem("az", skip_instance_cache=True, connection_string=AZURITE)
    assert deps.no_retries(fs.service_client)
    policy = fs.service_client._config.retry_policy
    assert [getattr(policy, name) for name in deps._RETRIES] == [0, 0, 0, 0]


def test_the_access_conditions_carry_the_etag():
    assert deps.if_match(None) is None
    assert deps.if_match('"0x8D"').if_match == '"0x8D"'


def test_the_raw_download_takes_what_we_give_it():
    parameters = inspect.signature(BlobOperations.download).parameters
    for name in ("range", "version_id", "modified_access_conditions", "timeout"):
        assert name in parameters
    assert inspect.iscoroutinefunction(BlobOperations.download)
