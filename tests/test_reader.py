"""ShardReader: samples of one shard through fsspec, from an offset, by ranges, with limits."""

from __future__ import annotations

import gzip

import pytest

from fsspec_shards.errors import ShardFormatError
from fsspec_shards.iteration.reader import ShardReader
from tests.shardmaker import shard_tar, zstd_compress


@pytest.fixture(params=["tar", "tar.gz", "tar.zst"])
def shard(request, tmp_path) -> str:
    raw = shard_tar(0, 5, payload_size=3000)
    path = tmp_path / f"s.{request.param}"
    compress = {"tar": bytes, "tar.gz": lambda data: gzip.compress(data, mtime=0)}
    path.write_bytes(compress.get(request.param, zstd_compress)(raw))
    return str(path)


def test_samples_from_an_offset_continue_the_full_read(shard):
    reader = ShardReader()
    full = list(reader.samples(shard))
    assert [sample.key for sample in full] == [f"s0000_{index:05d}" for index in range(5)]
    assert list(reader.samples(shard, full[2].offset)) == full[2:]


def test_headers_only_gives_the_same_keys_and_ranges_without_data(shard):
    reader = ShardReader()
    full = [(s.key, s.offset, s.end, set(s.fields)) for s in reader.samples(shard)]
    scanned = list(reader.samples(shard, headers_only=True))
    assert [(s.key, s.offset, s.end, set(s.fields)) for s in scanned] == full
    assert all(value == b"" for sample in scanned for value in sample.fields.values())


def test_samples_at_reads_the_saved_ranges(shard):
    reader = ShardReader()
    full = list(reader.samples(shard))
    ranges = [(full[3].offset, full[3].end), (full[0].offset, full[0].end)]
    assert reader.samples_at(shard, ranges) == [full[3], full[0]]


@pytest.mark.parametrize("limit", [2999, "2999B", "2KiB"])
def test_max_member_size_refuses_larger_members_in_every_read(shard, limit):
    reader = ShardReader(max_member_size=limit)
    with pytest.raises(ShardFormatError, match="exceeds limit") as caught:
        list(reader.samples(shard))
    assert caught.value.offset == 0 and "'s0000_00000.txt'" in caught.value.reason
    with pytest.raises(ShardFormatError, match="exceeds limit"):
        list(reader.samples(shard, headers_only=True))
    full = list(ShardReader().samples(shard))
    with pytest.raises(ShardFormatError, match="exceeds limit"):
        reader.samples_at(shard, [(full[1].offset, full[1].end)])
    assert len(list(ShardReader(max_member_size=3000).samples(shard))) == 5


@pytest.mark.parametrize("limit", ["lots", -1, True])
def test_an_invalid_max_member_size_names_the_option(limit):
    with pytest.raises(ValueError, match="max_member_size"):
        ShardReader(max_member_size=limit)


def test_an_empty_shard_file_is_a_shard_format_error(tmp_path):
    path = tmp_path / "empty.tar"
    path.write_bytes(b"")
    with pytest.raises(ShardFormatError, match="empty shard") as caught:
        list(ShardReader().samples(str(path)))
    assert str(path) in str(caught.value)


def test_a_saved_offset_past_the_end_of_the_shard_is_an_error(shard):
    reader = ShardReader()
    end = list(reader.samples(shard))[-1].end
    assert list(reader.samples(shard, end)) == []
    with pytest.raises(ShardFormatError, match="ends before the saved offset"):
        list(reader.samples(shard, end + 100 * 512 * 1024))


def test_a_damaged_gzip_shard_resumed_past_the_damage_is_a_shard_format_error(tmp_path):
    raw = shard_tar(0, 20, payload_size=3000)
    path = tmp_path / "cut.tar.gz"
    compressed = gzip.compress(raw, mtime=0)
    path.write_bytes(compressed[: len(compressed) // 2])
    with pytest.raises(ShardFormatError, match="corrupt compressed stream before the saved"):
        list(ShardReader().samples(str(path), len(raw) - 512))


def test_a_plain_path_with_a_wds_section_is_read_through_the_layer(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(shard_tar(0, 3))
    cache_dir = tmp_path / "cache"
    options = {"wds": {"cache_dir": str(cache_dir)}, "s3": {"endpoint_url": "http://x.invalid"}}
    reader = ShardReader(options)
    fs, _ = reader.locate(str(path))
    assert fs.protocol == "wds" and fs.options.cache_dir == str(cache_dir)
    assert len(list(reader.samples(str(path)))) == 3
    assert fs.cache_stats()["cached_files"] == 1


def test_a_chained_url_with_an_unused_backend_section_is_no_error(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(shard_tar(0, 2))
    options = {"wds": {"cache_dir": str(tmp_path / "c")}, "s3": {"key": "unused"}}
    assert len(list(ShardReader(options).samples(f"wds::file://{path}"))) == 2


def test_flat_options_for_a_plain_path_are_the_backends(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(shard_tar(0, 2))
    fs, _ = ShardReader({"auto_mkdir": False}).locate(str(path))
    assert fs.protocol != "wds"


def test_warm_makes_the_cache_where_the_dataset_is_made(tmp_path):
    """The one-time costs (the backend, the cache directory and its index) are paid when
    the dataset is made, before a DataLoader forks its workers: they find them done."""
    from fsspec_shards import ShardDataset

    path = tmp_path / "shard.tar"
    path.write_bytes(shard_tar(0, 3))
    cache = tmp_path / "cache"
    dataset = ShardDataset(f"wds::file://{path}", storage_options={"wds": {"cache_dir": cache}})
    assert cache.is_dir() and any(cache.iterdir())
    assert len(list(dataset)) == 3


def test_warm_leaves_an_error_to_the_read(tmp_path):
    """A shard that cannot be read fails where reads fail, through the handler, not when
    the dataset is made."""
    from fsspec_shards import ShardDataset

    missing = f"wds::file://{tmp_path}/missing.tar"
    dataset = ShardDataset(missing, storage_options={"wds": {"cache_dir": tmp_path / "c"}})
    with pytest.raises(FileNotFoundError, match="missing.tar"):
        list(dataset)
    assert list(ShardDataset(missing, handler="skip")) == []
    ShardReader().warm("nosuchprotocol://x/y.tar")  # an unknown protocol: left to the read


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("wds::s3://bucket/a/shard-0.tar", {"wds": {"cache": False}, "s3": {"anon": True}}),
        ("s3://bucket/a/shard-0.tar", {"wds": {"cache": False}, "s3": {"anon": True}}),
        ("wds::s3://bucket/a/shard-0.tar?versionId=7", {"s3": {"anon": True}}),
        ("wds::file:///data/shard-0.tar", {"wds": {"verify": "off"}, "gcs": {"token": "anon"}}),
        ("wds::simplecache::file:///data/shard-0.tar", {}),
    ],
)
def test_locate_opens_what_url_to_fs_opens(url, options):
    """A ``wds::`` URL resolved by the layer's ``from_url`` is the instance and path that
    fsspec's chain resolution gives (anything else is resolved by fsspec itself)."""
    import fsspec

    from fsspec_shards.option_shapes import fsspec_arguments

    fs, path = ShardReader(options).locate(url)
    chained, arguments = fsspec_arguments(url, options)
    expected = fsspec.core.url_to_fs(chained, **arguments)
    assert fs is expected[0] and path == expected[1]
