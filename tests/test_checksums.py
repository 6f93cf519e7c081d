"""The checksum formats: digests, hashers, sums files and block manifests."""

from __future__ import annotations

import hashlib
import json

import pytest

from fsspec_shards.checksums import (
    BlockHasher,
    BlockList,
    Checksum,
    StreamingHasher,
    block_manifest_name,
    format_block_manifest,
    format_sums,
    parse_block_manifest,
    parse_checksum,
    parse_sums_file,
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
    crc = StreamingHasher("crc32c")
    crc.update(b"abc")
    assert crc.checksum().hexdigest == "364b3fb7"  # RFC 3720 check value


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


def test_sums_are_written_in_gnu_sha256sum_text_format_and_read_back():
    other = Checksum("md5", MD5)
    text = format_sums([("a.tar", Checksum("sha256", SHA256)), ("sub/b.tar", other)])
    assert text == f"{SHA256}  a.tar\nmd5:{MD5}  sub/b.tar\n"
    assert parse_sums_file(text) == {"a.tar": Checksum("sha256", SHA256), "sub/b.tar": other}


@pytest.mark.parametrize("name", ["a\nb.tar", "a\\b.tar", ""])
def test_names_sha256sum_would_escape_are_refused_by_the_writer(name):
    with pytest.raises(ValueError, match="cannot be written in sha256sum format"):
        format_sums([(name, Checksum("sha256", SHA256))])


def block_list(data: bytes, block_size: int) -> BlockList:
    blocks = tuple(
        hashlib.sha256(data[start : start + block_size]).hexdigest()
        for start in range(0, len(data), block_size)
    )
    return BlockList(len(data), block_size, hashlib.sha256(data).hexdigest(), blocks)


@pytest.mark.parametrize("pieces", [1, 7, 4096, 10_000, 100_000])
def test_block_hasher_gives_the_same_blocks_whatever_the_pieces(pieces):
    hasher = BlockHasher(4096)
    for start in range(0, len(DATA), pieces):
        hasher.update(DATA[start : start + pieces])
    found = hasher.block_list()
    assert found == block_list(DATA, 4096)
    assert len(found) == -(-len(DATA) // 4096)
    assert found.checksum == Checksum("sha256", SHA256)
    assert found.bounds(len(found) - 1) == ((len(found) - 1) * 4096, len(DATA))
    assert found.block_at(4096) == 1
    assert found.matches(1, DATA[4096:8192])
    assert not found.matches(1, DATA[4097:8193])


def test_block_lists_of_empty_and_exact_multiple_files():
    empty = BlockHasher(4096)
    assert empty.block_list().blocks == ()
    exact = BlockHasher(4096)
    exact.update(bytes(8192))
    assert len(exact.block_list()) == 2


def test_block_manifest_round_trips_with_fixed_bytes():
    entries = [("a.tar", block_list(DATA, 4096)), ("sub/b.tar", block_list(b"xyz", 4096))]
    text = format_block_manifest(entries, 4096)
    lines = text.splitlines()
    assert lines[0] == (
        '{"format":"fsspec-shards-blocks","version":1,"algorithm":"sha256","block_size":4096}'
    )
    assert json.loads(lines[2]) == {
        "name": "sub/b.tar",
        "size": 3,
        "sha256": hashlib.sha256(b"xyz").hexdigest(),
        "blocks": [hashlib.sha256(b"xyz").hexdigest()],
    }
    assert text.endswith("\n") and text == format_block_manifest(entries, 4096)
    assert parse_block_manifest(text) == dict(entries)
    assert block_manifest_name("SHA256SUMS") == "SHA256SUMS.blocks"


def test_block_manifest_is_small_next_to_the_data():
    size = 1 << 30
    blocks = BlockList(size, 2 << 20, "0" * 64, ("0" * 64,) * 512)
    assert len(format_block_manifest([("train-000000.tar", blocks)], 2 << 20)) < 40_000


def test_block_manifest_refuses_entries_of_another_block_size():
    with pytest.raises(ValueError, match="blocks of 8192 bytes in a manifest of 4096"):
        format_block_manifest([("a.tar", block_list(DATA, 8192))], 4096)


GOOD_HEADER = '{"format":"fsspec-shards-blocks","version":1,"algorithm":"sha256","block_size":4096}'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "line 1: expected the header"),
        ("not json\n", "line 1: expected the header"),
        (GOOD_HEADER.replace('"version":1', '"version":2') + "\n", "format version 2"),
        (GOOD_HEADER.replace("4096", "10") + "\n", "at least 4096"),
        (GOOD_HEADER + "\n[1]\n", "line 2: not a JSON object"),
        (GOOD_HEADER + '\n{"name":"a.tar"}\n', "line 2: 'size'"),
        (
            GOOD_HEADER + f'\n{{"name":"a.tar","size":5000,"sha256":"{SHA256}","blocks":[]}}\n',
            "line 2: a file of 5000 bytes in blocks of 4096 has 2 blocks, not 0",
        ),
        (
            GOOD_HEADER + f'\n{{"name":"a.tar","size":1,"sha256":"{SHA256}","blocks":["ab"]}}\n',
            "line 2: 'ab' is not a lowercase sha256",
        ),
    ],
)
def test_malformed_block_manifests_name_the_manifest_and_the_line(text, message):
    with pytest.raises(ValueError, match="block manifest SUMS.blocks") as raised:
        parse_block_manifest(text, "SUMS.blocks")
    assert message in str(raised.value)


def test_block_manifest_entry_listed_twice_with_other_blocks_is_an_error():
    one = format_block_manifest([("a.tar", block_list(DATA, 4096))], 4096)
    two = format_block_manifest([("./a.tar", block_list(b"other", 4096))], 4096)
    with pytest.raises(ValueError, match="line 3: a.tar is listed again"):
        parse_block_manifest(one + two.splitlines(keepends=True)[1], "SUMS.blocks")
