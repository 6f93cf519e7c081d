"""The one verification rule against crafted manifests, on local files and over HTTP (nginx,
through both transports): a block manifest only checks bytes earlier, never instead of the
whole-file checksum, and every checksum a manifest gives is checked.

- Storage holds B; ``SHA256SUMS`` says sha256(A); ``SHA256SUMS.blocks`` says sha256(A) too,
  but lists B's blocks: every block matches, the whole file does not. An ``IntegrityError``
  naming both manifests, nothing cached, and no reader gets to B's end.
- ``SHA256SUMS`` gives the shard in md5 form, and ``SHA256SUMS.blocks`` has an entry for it:
  the md5 is checked too.
"""

from __future__ import annotations

import hashlib
import random

import fsspec
import pytest

from fsspec_shards.checksums import BlockHasher, Checksum, format_block_manifest, format_sums
from fsspec_shards.errors import IntegrityError
from tests.integration.conftest import served

BLOCK = 64 * 1024
A = random.Random(31).randbytes(12 * BLOCK + 99)
B = random.Random(32).randbytes(len(A))
NAME = "crafted/train-0000.tar"


def _blocks(data: bytes):
    hasher = BlockHasher(BLOCK)
    hasher.update(data)
    return hasher.block_list()


@pytest.fixture(params=["file", "http-fsspec", "http-obstore"])
def store(request, tmp_path):
    """(backend, transport) for local files and for nginx through each transport."""
    if request.param == "file":
        return request.getfixturevalue("file_backend"), "fsspec"
    backend = request.getfixturevalue("http_backend")
    return backend, served(backend, request.param.split("-")[1])


def _filesystem(backend, transport, tmp_path, sums: Checksum, blocks, **wds):
    backend.put(NAME, B)
    backend.put("crafted/SHA256SUMS", format_sums([("train-0000.tar", sums)]).encode())
    manifest = format_block_manifest([("train-0000.tar", blocks)], BLOCK)
    backend.put("crafted/SHA256SUMS.blocks", manifest.encode())
    options = {
        "cache_dir": str(tmp_path / "cache"),
        "checksums": backend.url("crafted/SHA256SUMS"),
        "backoff": 0.01,
        "max_backoff": 0.05,
        "transport": transport,
        **wds,
    }
    fs, path = fsspec.core.url_to_fs(
        f"wds::{backend.url(NAME)}",
        skip_instance_cache=True,
        wds=options,
        **{backend.protocol: backend.storage_options},
    )
    assert fs.fetcher.blocks_of(path) is not None
    return fs, path


def _lying_blocks():
    """B's blocks under A's whole-file digest (agreeing with the sums file)."""
    b = _blocks(B)
    return b.__class__(b.size, b.block_size, hashlib.sha256(A).hexdigest(), b.blocks)


@pytest.mark.parametrize("ranges_in_flight", [1, 8])
def test_blocks_of_other_bytes_than_the_whole_digest_fail_and_nothing_is_cached(
    store, tmp_path, ranges_in_flight
):
    backend, transport = store
    sums = Checksum("sha256", hashlib.sha256(A).hexdigest())
    fs, path = _filesystem(
        backend, transport, tmp_path, sums, _lying_blocks(), ranges_in_flight=ranges_in_flight
    )
    with fs.open(path) as handle:
        head = handle.read(BLOCK)
        assert head == B[:BLOCK]  # a block-verified block may be handed out early
        with pytest.raises(IntegrityError) as raised:
            handle.read()  # ... but never the file's end
    message = str(raised.value)
    assert "crafted/SHA256SUMS " in message + " " and "crafted/SHA256SUMS.blocks" in message
    assert raised.value.actual == f"sha256:{hashlib.sha256(B).hexdigest()}"
    with pytest.raises(IntegrityError):
        fs.cat_file(path)
    assert fs.cache_stats()["cached_files"] == 0


def test_blocks_of_other_bytes_fail_a_whole_read_without_cache(store, tmp_path):
    backend, transport = store
    sums = Checksum("sha256", hashlib.sha256(A).hexdigest())
    fs, path = _filesystem(backend, transport, tmp_path, sums, _lying_blocks(), cache=False)
    with pytest.raises(IntegrityError, match="SHA256SUMS"):
        fs.cat_file(path)
    with fs.open(path, block_size=BLOCK) as handle:  # streamed, block by block
        assert handle.read(BLOCK) == B[:BLOCK]
        with pytest.raises(IntegrityError, match="SHA256SUMS"):
            handle.read()  # the last read checks the whole file


@pytest.mark.parametrize("cache", [True, False])
def test_an_md5_line_of_the_sums_file_is_checked_beside_a_block_manifest_entry(
    store, tmp_path, cache
):
    backend, transport = store
    wrong = Checksum("md5", hashlib.md5(A).hexdigest())  # B's blocks are all honest
    fs, path = _filesystem(backend, transport, tmp_path, wrong, _blocks(B), cache=cache)
    with pytest.raises(IntegrityError) as raised:
        fs.cat_file(path)
    assert raised.value.expected == str(wrong)
    assert raised.value.actual == f"md5:{hashlib.md5(B).hexdigest()}"
    assert fs.cache_stats()["cached_files"] == 0


def test_an_md5_line_that_matches_beside_a_block_manifest_entry_reads(store, tmp_path):
    backend, transport = store
    right = Checksum("md5", hashlib.md5(B).hexdigest())
    fs, path = _filesystem(backend, transport, tmp_path, right, _blocks(B))
    assert fs.cat_file(path) == B
    assert fs.cat_file(path) == B  # (local files are read in place, remote ones cached)
    assert fs.cache_stats()["integrity_failures"] == 0


@pytest.mark.parametrize("transport", ["fsspec", "obstore"])
@pytest.mark.parametrize("with_blocks", [True, False])
def test_manifests_are_read_through_the_transport_downloads_use(
    s3_backend, fault_proxy, tmp_path, transport, with_blocks
):
    """With obstore, the sums file and its block manifest are read through obstore (a
    DataLoader worker then starts no botocore session before its first block); a block
    manifest that is not there is still no error, and the manifest still verifies."""
    prefix = f"manifest-{transport}-{with_blocks}"
    s3_backend.put(f"{prefix}/train-0000.tar", A)
    s3_backend.put(
        f"{prefix}/SHA256SUMS",
        format_sums(
            [("train-0000.tar", Checksum("sha256", hashlib.sha256(A).hexdigest()))]
        ).encode(),
    )
    if with_blocks:
        manifest = format_block_manifest([("train-0000.tar", _blocks(A))], BLOCK)
        s3_backend.put(f"{prefix}/SHA256SUMS.blocks", manifest.encode())
    proxy, proxied = fault_proxy(s3_backend)
    fs, path = fsspec.core.url_to_fs(
        f"wds::{proxied.url(f'{prefix}/train-0000.tar')}",
        skip_instance_cache=True,
        wds={
            "cache_dir": str(tmp_path / "cache"),
            "checksums": proxied.url(f"{prefix}/SHA256SUMS"),
            "transport": transport,
        },
        s3=proxied.storage_options,
    )
    manifest = fs.fetcher.manifest
    assert manifest.lookup(path) == Checksum("sha256", hashlib.sha256(A).hexdigest())
    assert (manifest.lookup_blocks(path) is not None) == with_blocks
    reads = [e for e in proxy.requests() if "SHA256SUMS" in e.path]
    assert len(reads) >= 2, reads  # the sums file and (found or not) its block manifest
    agents = {str(e.headers.get("user-agent")).startswith("object_store/") for e in reads}
    assert agents == {transport == "obstore"}, agents
    with fs.open(path, "rb") as handle:
        assert handle.read() == A


def test_an_empty_sums_file_read_through_obstore_is_an_empty_manifest(s3_backend, tmp_path):
    """An empty object has no byte 0 for obstore's ranged GET (HTTP 416): it is read whole,
    an empty manifest as through the fsspec backend."""
    s3_backend.put("empty/SHA256SUMS", b"")
    s3_backend.put("empty/train-0000.tar", A)
    fs, _ = fsspec.core.url_to_fs(
        f"wds::{s3_backend.url('empty/train-0000.tar')}",
        skip_instance_cache=True,
        wds={
            "cache_dir": str(tmp_path / "cache"),
            "checksums": s3_backend.url("empty/SHA256SUMS"),
            "transport": "obstore",
            "retries": 1,
        },
        s3=s3_backend.storage_options,
    )
    assert len(fs.fetcher.manifest) == 0
