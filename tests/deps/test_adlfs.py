"""adlfs's private parts we use (``storage/deps/adlfs.py``): these fail when adlfs changes
them."""

from __future__ import annotations

import fsspec

from fsspec_shards.storage.deps import adlfs as deps

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"
    "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


def test_the_users_time_outs_are_kept_as_sdk_keywords():
    fs = fsspec.filesystem(
        "az",
        skip_instance_cache=True,
        connection_string=AZURITE,
        connection_timeout=5,
        read_timeout=7,
    )
    given = deps.timeout_kwargs(fs)
    assert (given["connection_timeout"], given["read_timeout"]) == (5, 7)
