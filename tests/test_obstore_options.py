"""map_options: a backend's obstore mapping applied, or why there is none. Each backend's
own rows are in tests/backends/test_<backend>.py."""

from __future__ import annotations

import pytest

from fsspec_shards.storage.backends.obstore_options import StoreSpec, Unmappable, map_options
from tests.obstore_helpers import (
    S3_ENDPOINT,
    no_ambient_credentials,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.usefixtures("no_ambient_credentials")


@pytest.mark.parametrize("protocol", ["file", "memory", "sftp"])
def test_a_backend_without_an_obstore_store_is_unmappable_by_protocol(protocol):
    reason = f"obstore has no store for protocol {protocol!r}"
    assert map_options(protocol, {}) == Unmappable("target_protocol", reason)


def test_options_that_are_not_a_mapping_are_unmappable():
    assert map_options("s3", {"client_kwargs": ["endpoint_url"]}).option == "client_kwargs"


def test_equal_options_give_equal_store_keys_and_other_options_other_keys():
    one, same = (map_options("s3", {"anon": True, **S3_ENDPOINT}) for _ in range(2))
    other = map_options("s3", {"anon": True, "endpoint_url": "http://127.0.0.1:9"})
    assert isinstance(one, StoreSpec) and one.key == same.key != other.key
