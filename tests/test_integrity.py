"""Checksums, manifests and the choice of what to verify."""

from __future__ import annotations

import base64
import hashlib

import fsspec
import pytest

from fsspec_shards.checksums import BlockHasher, format_block_manifest, format_sums
from fsspec_shards.storage.backends import backend_for
from fsspec_shards.storage.core.integrity import (
    Checksum,
    Manifest,
    load_manifest,
    manifest_from_mapping,
)

DATA = b"fsspec-shards integrity test data\n" * 1000
SHA256 = hashlib.sha256(DATA).hexdigest()
MD5 = hashlib.md5(DATA).hexdigest()


def test_sums_file_names_of_every_form_resolve_to_full_backend_paths(tmp_path):
    text = (
        f"{SHA256}  ./rel.tar\n"
        f"{SHA256} *sub/../bin.tar\n"
        f"{SHA256}  {tmp_path}/abs.tar\n"
        f"{SHA256}  file://{tmp_path}/url.tar\n"
        f"{SHA256}  s3://bucket/elsewhere.tar\n"
    )
    (tmp_path / "SHA256SUMS").write_text(text)
    manifest = load_manifest(str(tmp_path / "SHA256SUMS"), fsspec.filesystem("file"))
    expected = Checksum("sha256", SHA256)
    for name in ("rel.tar", "bin.tar", "abs.tar", "url.tar"):
        assert manifest.lookup(f"{tmp_path}/{name}") == expected, name
    assert manifest.lookup("s3://bucket/elsewhere.tar") == expected
    assert sorted(manifest.entries) == sorted(
        [f"{tmp_path}/{name}" for name in ("rel.tar", "bin.tar", "abs.tar", "url.tar")]
        + ["s3://bucket/elsewhere.tar"]
    )


def test_manifest_names_resolve_against_the_manifest_directory():
    manifest = Manifest({"a.tar": Checksum("sha256", SHA256)}, base="bucket/data")
    assert manifest.lookup("bucket/data/a.tar") == Checksum("sha256", SHA256)
    assert manifest.lookup("bucket/other/a.tar") is None


def test_mapping_manifest_matches_urls_exact_paths_and_trailing_components():
    strip = fsspec.get_filesystem_class("s3")._strip_protocol
    manifest = manifest_from_mapping(
        {"s3://bucket/x/a.tar": f"sha256:{SHA256}", "b.tar": f"md5:{MD5}"}, strip
    )
    assert manifest.lookup("bucket/x/a.tar").algorithm == "sha256"
    assert manifest.lookup("bucket/y/b.tar").algorithm == "md5"
    assert manifest.lookup("bucket/y/ab.tar") is None


def test_signed_http_urls_find_their_manifest_checksum_whatever_the_query_string():
    """A signed URL's query changes per request; the manifest names the object without it."""
    signed = "https://host/data/a.tar?X-Amz-Signature=abc&X-Amz-Expires=60"
    expected = Checksum("sha256", SHA256)
    by_directory = Manifest({"a.tar": expected}, base="https://host/data")
    by_name = manifest_from_mapping({"a.tar": f"sha256:{SHA256}"})
    by_url = manifest_from_mapping({"https://host/data/a.tar": f"sha256:{SHA256}"})
    for manifest in (by_directory, by_name, by_url):
        assert manifest.lookup(signed) == expected
    assert by_directory.lookup("https://host/data/b.tar?X-Amz-Signature=abc") is None


def test_manifest_file_is_loaded_through_the_backend(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "SHA256SUMS").write_text(
        format_sums([("a.tar", Checksum("sha256", SHA256))])
    )
    local = fsspec.filesystem("file")
    manifest = load_manifest(f"file://{tmp_path}/data/SHA256SUMS", local)
    assert manifest.lookup(f"{tmp_path}/data/a.tar") == Checksum("sha256", SHA256)


def test_manifest_on_another_protocol_matches_by_trailing_components(tmp_path):
    (tmp_path / "MD5SUMS").write_text(f"{MD5}  shards/a.tar\n")
    memory = fsspec.filesystem("memory")
    manifest = load_manifest(f"file://{tmp_path}/MD5SUMS", memory)
    assert manifest.lookup("/bucket/shards/a.tar") == Checksum("md5", MD5)


def _b64(hexdigest: str) -> str:
    return base64.b64encode(bytes.fromhex(hexdigest)).decode()


def test_backend_checksums_come_from_s3_gcs_and_azure_info():
    s3 = backend_for("s3")
    assert s3.checksums({"ETag": f'"{MD5}"'}) == [Checksum("md5", MD5)]
    assert s3.checksums({"ETag": f'"{MD5}-3"'}) == []  # multipart: not an MD5
    assert s3.checksums({"ETag": f'"{MD5}"', "ServerSideEncryption": "aws:kms"}) == []
    assert Checksum("sha256", SHA256) in s3.checksums({"ChecksumSHA256": _b64(SHA256)})
    gcs = backend_for("gcs").checksums({"md5Hash": _b64(MD5), "crc32c": _b64("364b3fb7")})
    assert set(gcs) == {Checksum("md5", MD5), Checksum("crc32c", "364b3fb7")}
    azure = {"content_settings": {"content_md5": bytearray(bytes.fromhex(MD5))}}
    assert backend_for("az").checksums(azure) == [Checksum("md5", MD5)]
    assert backend_for("http").checksums({"ETag": f'"{MD5}"'}) == []  # an http ETag is opaque


def test_identity_changes_with_version_etag_or_mtime_and_size():
    http, gcs, local = backend_for("http"), backend_for("gcs"), backend_for("file")
    assert http.identity({"ETag": '"a"', "size": 1}) != http.identity({"ETag": '"b"', "size": 1})
    assert gcs.identity({"generation": "1", "size": 1}) != gcs.identity(
        {"generation": "2", "size": 1}
    )
    assert local.identity({"mtime": 1.0, "size": 1}) != local.identity({"mtime": 1.0, "size": 2})


def write_pair(directory, data: bytes, block_size: int = 4096):
    """SHA256SUMS and SHA256SUMS.blocks for ``a.tar`` (holding ``data``) in ``directory``."""
    hasher = BlockHasher(block_size)
    hasher.update(data)
    blocks = hasher.block_list()
    (directory / "SHA256SUMS").write_text(format_sums([("a.tar", blocks.checksum)]))
    (directory / "SHA256SUMS.blocks").write_text(
        format_block_manifest([("a.tar", blocks)], block_size)
    )
    return blocks


def test_block_manifest_beside_the_sums_file_is_found_and_used(tmp_path):
    blocks = write_pair(tmp_path, DATA)
    manifest = load_manifest(f"file://{tmp_path}/SHA256SUMS", fsspec.filesystem("file"))
    assert manifest.lookup_blocks(f"{tmp_path}/a.tar") == blocks
    assert manifest.lookup_blocks(f"{tmp_path}/b.tar") is None
    assert manifest.lookup(f"{tmp_path}/a.tar") == Checksum("sha256", SHA256)


def test_no_block_manifest_means_whole_files_only(tmp_path):
    write_pair(tmp_path, DATA)
    (tmp_path / "SHA256SUMS.blocks").unlink()
    manifest = load_manifest(str(tmp_path / "SHA256SUMS"), fsspec.filesystem("file"))
    assert manifest.lookup_blocks(f"{tmp_path}/a.tar") is None
    assert manifest.lookup(f"{tmp_path}/a.tar") == Checksum("sha256", SHA256)


def test_block_manifest_on_another_protocol_matches_by_trailing_components(tmp_path):
    blocks = write_pair(tmp_path, DATA)
    manifest = load_manifest(f"file://{tmp_path}/SHA256SUMS", fsspec.filesystem("memory"))
    assert manifest.lookup_blocks("/bucket/a.tar") == blocks


def test_a_stale_block_manifest_is_an_error_naming_both_files(tmp_path):
    write_pair(tmp_path, DATA)
    (tmp_path / "SHA256SUMS").write_text(format_sums([("a.tar", Checksum("sha256", "0" * 64))]))
    with pytest.raises(ValueError, match=r"SHA256SUMS.blocks lists a.tar .* stale"):
        load_manifest(str(tmp_path / "SHA256SUMS"), fsspec.filesystem("file"))


def test_every_checksum_the_manifests_give_is_known_with_its_source(tmp_path):
    write_pair(tmp_path, DATA)
    md5 = Checksum("md5", MD5)
    (tmp_path / "SHA256SUMS").write_text(format_sums([("a.tar", md5)]))  # a line in md5 form
    manifest = load_manifest(str(tmp_path / "SHA256SUMS"), fsspec.filesystem("file"))
    known = manifest.known(f"{tmp_path}/a.tar")
    assert [k.checksum for k in known] == [md5, Checksum("sha256", SHA256)]  # both, not one
    assert known[0].source.endswith("SHA256SUMS") and known[1].source.endswith(".blocks")
    assert manifest.known(f"{tmp_path}/b.tar") == []


@pytest.mark.parametrize("name", ["SHA256SUMS", "SHA256SUMS.blocks"])
def test_a_manifest_that_is_not_utf8_is_an_error_naming_the_file_and_line(tmp_path, name):
    write_pair(tmp_path, DATA)
    path = tmp_path / name
    lines = path.read_bytes().splitlines(keepends=True)
    lines[-1] = lines[-1].replace(b"a.tar", b"\xff\xfe.tar")
    path.write_bytes(b"".join(lines))
    with pytest.raises(ValueError, match=rf"{name} line {len(lines)}: not UTF-8 text"):
        load_manifest(str(tmp_path / "SHA256SUMS"), fsspec.filesystem("file"))


def test_the_sums_file_and_its_block_manifest_are_read_at_once(tmp_path):
    """Both GETs are in flight together: a DataLoader worker's first file waits for one
    request's time, not two (each read here waits until the other has started)."""
    import threading

    (tmp_path / "SHA256SUMS").write_text(format_sums([("a.tar", Checksum("sha256", SHA256))]))
    (tmp_path / "SHA256SUMS.blocks").write_text(format_block_manifest([], 4096))
    local = fsspec.filesystem("file")
    both_started = threading.Barrier(2, timeout=10)
    read: list[str] = []

    def read_own(path: str) -> bytes:
        both_started.wait()
        read.append(path)
        return local.cat_file(path)

    manifest = load_manifest(str(tmp_path / "SHA256SUMS"), local, read_own)
    assert manifest.lookup(f"{tmp_path}/a.tar") == Checksum("sha256", SHA256)
    assert sorted(read) == [f"{tmp_path}/SHA256SUMS", f"{tmp_path}/SHA256SUMS.blocks"]
