"""Two different objects never share a cache entry; one object signed twice is one entry;
listings never go stale. Against real servers: two S3 server processes (in one process
moto's backends are shared), two Azurite accounts, nginx, and a server whose query
selects the content."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from tests.integration import servers
from tests.integration.hostile_http import HostileServer
from tests.wds_filesystem import wds_filesystem

KEY = "same/key.bin"


class _MotoProcess(servers._SubprocessServer):
    """moto's S3 server in a process of its own: a second endpoint with its own objects."""

    name = "moto"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", servers.LOOPBACK, "-p", str(port)]

    def backend(self, prefix: str) -> servers.S3Backend:
        endpoint = f"http://{servers.LOOPBACK}:{self.port}"
        return servers.S3Backend("s3", prefix, "moto", endpoint_url=endpoint)


@pytest.fixture(scope="module")
def second_s3(tmp_path_factory) -> Iterator[_MotoProcess]:
    server = _MotoProcess(tmp_path_factory.mktemp("moto-second")).start()
    try:
        server.backend("").filesystem().mkdir(servers.BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def second_azurite(tmp_path_factory) -> Iterator[servers.AzuriteServer]:
    executable = servers.find_azurite()
    if executable is None:
        pytest.skip("Azurite not found")
    server = servers.AzuriteServer(executable, tmp_path_factory.mktemp("azurite-second"))
    yield server.start()
    server.stop()


def test_one_key_at_two_s3_endpoints_is_two_objects(s3_backend, second_s3, tmp_path, transport):
    """Through either transport: obstore's stores are told apart by endpoint too."""
    other = second_s3.backend(s3_backend.prefix)
    assert s3_backend.put(KEY, b"endpoint A") == other.put(KEY, b"endpoint B, longer")
    url = s3_backend.url(KEY)
    first, second = (
        wds_filesystem("s3", b.storage_options, cache_dir=tmp_path, transport=transport)
        for b in (s3_backend, other)
    )
    for _ in range(2):  # the second round comes from the cache
        assert first.cat_file(url) == b"endpoint A"
        assert second.cat_file(url) == b"endpoint B, longer"
    stats = second.cache_stats()
    assert (stats["misses"], stats["hits"], stats["cached_files"]) == (2, 2, 2)


def test_one_blob_in_two_azure_accounts_is_two_objects(
    az_backend, second_azurite, tmp_path, transport
):
    other = second_azurite.backend(az_backend.prefix)
    assert az_backend.put(KEY, b"account A") == other.put(KEY, b"account B, longer")
    url = az_backend.url(KEY)
    first, second = (
        wds_filesystem("az", b.storage_options, cache_dir=tmp_path, transport=transport)
        for b in (az_backend, other)
    )
    for _ in range(2):
        assert first.cat_file(url) == b"account A"
        assert second.cat_file(url) == b"account B, longer"
    assert second.cache_stats()["cached_files"] == 2


@pytest.mark.parametrize(
    "name",
    [
        "key",
        "id",
        "token",
        "shard",
    ],
)
def test_query_selectors_name_different_objects(tmp_path, name):
    with HostileServer() as server:
        first = server.put(f"get?{name}=shard-0001.tar", b"first shard")
        second = server.put(f"get?{name}=shard-0002.tar", b"second shard, longer")
        fs = wds_filesystem("http", {}, cache_dir=tmp_path)
        for _ in range(2):
            assert fs.cat_file(first) == b"first shard"
            assert fs.cat_file(second) == b"second shard, longer"
        assert fs.cache_stats()["cached_files"] == 2


def test_a_url_signed_again_is_one_download_and_one_entry(http_backend, tmp_path):
    data = b"signed object" * 1000
    url = http_backend.put("signed/shard.tar", data)
    fs = wds_filesystem("http", {}, cache_dir=tmp_path)
    for date, signature in (("20260101T000000Z", "aaaa"), ("20260301T120000Z", "bbbb")):
        signed = (
            f"{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F{date[:8]}"
            f"&X-Amz-Date={date}&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
            f"&X-Amz-Signature={signature}"
        )
        assert fs.cat_file(signed) == data
    stats = fs.cache_stats()
    assert (stats["misses"], stats["hits"], stats["cached_files"]) == (1, 1, 1)
    assert stats["bytes_downloaded"] == len(data)


@pytest.mark.parametrize("given", [False, True])
def test_listings_never_go_stale(s3_backend, tmp_path, given):
    """A listing made through wds does not hide a replaced or a new object, also when the
    backend instance is the user's own, with its listing cache on."""
    s3_backend.put("listed/a.bin", b"old")
    if given:
        fs = fsspec.filesystem(
            "wds",
            fs=fsspec.filesystem("s3", **s3_backend.storage_options),
            skip_instance_cache=True,
            cache_dir=str(tmp_path / "cache"),
        )
    else:
        fs = wds_filesystem("s3", s3_backend.storage_options, cache_dir=tmp_path / "cache")
    folder = s3_backend.url("listed")
    assert [Path(p).name for p in fs.ls(folder, detail=False)] == ["a.bin"]
    s3_backend.put("listed/a.bin", b"replaced, longer")
    s3_backend.put("listed/b.bin", b"new")
    assert fs.cat_file(s3_backend.url("listed/a.bin")) == b"replaced, longer"
    assert fs.cat_file(s3_backend.url("listed/b.bin")) == b"new"
    assert fs.info(s3_backend.url("listed/b.bin"))["size"] == 3
