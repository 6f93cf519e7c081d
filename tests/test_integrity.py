"""Checksums, manifests and the choice of what to verify."""

from __future__ import annotations

import base64
import hashlib

import fsspec
import pytest

from fsspec_shards.storage.backends import backend_checksums, object_identity
from fsspec_shards.storage.integrity import (
    Checksum,
    Manifest,
    StreamingHasher,
    checksum_of_bytes,
    choose_expected,
    format_sums_line,
    load_manifest,
    manifest_from_mapping,
    parse_checksum,
    parse_sums_file,
    parse_verify,
)

DATA = b"fsspec-shards integrity test data\n" * 1000
SHA256 = hashlib.sha256(DATA).hexdigest()
MD5 = hashlib.md5(DATA).hexdigest()


def test_checksums_parse_with_prefix_or_by_digest_length():
    assert parse_checksum(f"sha256:{SHA256.upper()}") == Checksum("sha256", SHA256)
    assert parse_checksum(f"md5:{MD5}") == Checksum("md5", MD5)
    assert parse_checksum("crc32c:364b3fb7") == Checksum("crc32c", "364b3fb7")
    assert parse_checksum(SHA256).algorithm == "sha256"
    assert str(parse_checksum(f"md5:{MD5}")) == f"md5:{MD5}"


@pytest.mark.parametrize("text", ["sha1:abcd", "sha256:xyz", f"md5:{SHA256}", "", "zz", 5])
def test_malformed_checksums_are_rejected_with_a_clear_message(text):
    with pytest.raises(ValueError, match="invalid checksum"):
        parse_checksum(text)


def test_streaming_hashers_match_one_shot_digests_whatever_the_pieces():
    for algorithm, expected in (("sha256", SHA256), ("md5", MD5)):
        hasher = StreamingHasher(algorithm)
        for i in range(0, len(DATA), 777):
            hasher.update(DATA[i : i + 777])
        assert hasher.checksum().hexdigest == expected
    assert checksum_of_bytes(b"abc", "crc32c").hexdigest == "364b3fb7"  # RFC 3720 check value


def test_sums_files_parse_text_and_binary_markers_comments_and_dot_slash():
    text = (
        "# made by sha256sum\n"
        f"{SHA256}  train-0000.tar\n"
        f"{SHA256} *sub/train-0001.tar\n"
        f"md5:{MD5}  ./train-0002.tar\n"
        "\n"
    )
    entries = parse_sums_file(text)
    assert set(entries) == {"train-0000.tar", "sub/train-0001.tar", "train-0002.tar"}
    assert entries["train-0002.tar"] == Checksum("md5", MD5)


def test_malformed_sums_line_names_the_line():
    with pytest.raises(ValueError, match="line 2"):
        parse_sums_file(f"{SHA256}  a.tar\nnot a checksum line\n", "SHA256SUMS")


@pytest.mark.parametrize(
    ("digest", "why"),
    [("g" * 64, "64 hex digits"), (SHA256[:63], "invalid checksum"), (SHA256 + "0", "invalid")],
)
def test_sums_file_digests_that_are_not_hex_of_their_length_name_manifest_and_line(digest, why):
    text = f"{SHA256}  a.tar\n{digest}  b.tar\n"
    with pytest.raises(ValueError, match="manifest SHA256SUMS line 2") as raised:
        parse_sums_file(text, "SHA256SUMS")
    assert why in str(raised.value)
    assert "\n" not in str(raised.value)


def test_sums_file_entry_listed_twice_is_fine_with_one_digest_an_error_with_two():
    assert parse_sums_file(f"{SHA256}  a.tar\n{SHA256} *./a.tar\n") == {
        "a.tar": Checksum("sha256", SHA256)
    }
    other = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(ValueError, match=r"line 3: a.tar is listed again .*first on line 1"):
        parse_sums_file(f"{SHA256}  a.tar\n{other}  b.tar\n{other}  ./a.tar\n", "SUMS")


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
        format_sums_line(Checksum("sha256", SHA256), "a.tar") + "\n"
    )
    local = fsspec.filesystem("file")
    manifest = load_manifest(f"file://{tmp_path}/data/SHA256SUMS", local)
    assert manifest.lookup(f"{tmp_path}/data/a.tar") == Checksum("sha256", SHA256)


def test_manifest_on_another_protocol_matches_by_trailing_components(tmp_path):
    (tmp_path / "MD5SUMS").write_text(f"{MD5}  shards/a.tar\n")
    memory = fsspec.filesystem("memory")
    manifest = load_manifest(f"file://{tmp_path}/MD5SUMS", memory)
    assert manifest.lookup("/bucket/shards/a.tar") == Checksum("md5", MD5)


def test_auto_prefers_the_manifest_then_the_strongest_backend_checksum():
    sha = Checksum("sha256", SHA256)
    md5 = Checksum("md5", MD5)
    crc = Checksum("crc32c", "364b3fb7")
    assert choose_expected(md5, [sha], "auto") == md5
    assert choose_expected(None, [crc, md5], "auto") == md5
    assert choose_expected(None, [], "auto") is None
    assert choose_expected(sha, [md5], "size") is None
    assert choose_expected(sha, [md5], False) is None


@pytest.mark.parametrize(
    ("value", "mode"),
    [("auto", "auto"), (True, "auto"), ("size", "size"), (False, False), ("false", False)],
)
def test_verify_option_accepts_modes_and_environment_strings(value, mode):
    assert parse_verify(value) == mode


def test_verify_option_rejects_unknown_modes():
    with pytest.raises(ValueError, match="verify"):
        parse_verify("sha256")


def _b64(hexdigest: str) -> str:
    return base64.b64encode(bytes.fromhex(hexdigest)).decode()


def test_backend_checksums_come_from_s3_gcs_and_azure_info():
    assert backend_checksums("s3", {"ETag": f'"{MD5}"'}) == [Checksum("md5", MD5)]
    assert backend_checksums("s3", {"ETag": f'"{MD5}-3"'}) == []  # multipart: not an MD5
    assert backend_checksums("s3", {"ETag": f'"{MD5}"', "ServerSideEncryption": "aws:kms"}) == []
    assert Checksum("sha256", SHA256) in backend_checksums("s3", {"ChecksumSHA256": _b64(SHA256)})
    gcs = backend_checksums("gcs", {"md5Hash": _b64(MD5), "crc32c": _b64("364b3fb7")})
    assert set(gcs) == {Checksum("md5", MD5), Checksum("crc32c", "364b3fb7")}
    azure = {"content_settings": {"content_md5": bytearray(bytes.fromhex(MD5))}}
    assert backend_checksums("az", azure) == [Checksum("md5", MD5)]
    assert backend_checksums("http", {"ETag": f'"{MD5}"'}) == []  # an http ETag is opaque


def test_identity_changes_with_version_etag_or_mtime_and_size():
    assert object_identity({"ETag": '"a"', "size": 1}) != object_identity(
        {"ETag": '"b"', "size": 1}
    )
    assert object_identity({"generation": "1", "size": 1}) != object_identity(
        {"generation": "2", "size": 1}
    )
    assert object_identity({"mtime": 1.0, "size": 1}) != object_identity({"mtime": 1.0, "size": 2})
