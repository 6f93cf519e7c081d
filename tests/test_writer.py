"""ShardWriter on local disk: round trips, rollover, manifest and counts, and no partial shard."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy
import pytest

from fsspec_shards import ShardDataset, ShardWriter
from fsspec_shards.checksums import parse_block_manifest
from fsspec_shards.iteration import transforms
from fsspec_shards.iteration.encoding import encode_sample
from fsspec_shards.iteration.lengths import load_sample_counts

TIMEOUT = 180


def make_sample(index: int) -> dict:
    """A sample with every kind of value: bytes, str, int, JSON and a numpy array."""
    return {
        "__key__": f"sample{index:05d}",
        "bin": bytes([index % 256]) * (index * 37 % 3000),
        "txt": f"caption {index} ü",
        "cls": index % 10,
        "json": {"index": index, "tags": ["a", "b"][: index % 3]},
        "npy": numpy.arange(index % 7, dtype=numpy.int16),
    }


def encoded(sample: dict) -> dict:
    """What a reader gives back for ``sample``: its fields' bytes under their names."""
    key, members = encode_sample(sample)
    return {"__key__": key, **{name[len(key) + 1 :]: data for name, data in members}}


def without_url(samples) -> list[dict]:
    return [{k: v for k, v in sample.items() if k != "__url__"} for sample in samples]


def write_samples(pattern: str, count: int, **options) -> ShardWriter:
    with ShardWriter(pattern, **options) as writer:
        for index in range(count):
            writer.write(make_sample(index))
    return writer


def test_shard_dataset_reads_back_exactly_what_was_written(tmp_path):
    writer = write_samples(str(tmp_path / "train-%06d.tar"), 25, max_count=10)
    assert [shard.samples for shard in writer.shards] == [10, 10, 5]
    pattern = str(tmp_path / "train-{000000..000002}.tar")
    read = without_url(ShardDataset(pattern, shuffle_shards=False, split_by_node=False))
    assert read == [encoded(make_sample(index)) for index in range(25)]
    decoded = list(ShardDataset(pattern, shuffle_shards=False, transforms=[transforms.decode()]))
    assert decoded[7]["cls"] == 7 and decoded[7]["json"] == {"index": 7, "tags": ["a"]}
    assert (decoded[6]["npy"] == numpy.arange(6, dtype=numpy.int16)).all()


def test_webdatasets_reader_reads_the_same_samples(tmp_path):
    webdataset = pytest.importorskip("webdataset")
    writer = write_samples(str(tmp_path / "train-%06d.tar"), 12, max_count=5)
    urls = [shard.url for shard in writer.shards]
    theirs = webdataset.WebDataset(urls, shardshuffle=False, nodesplitter=None, workersplitter=None)
    fields = [{k: v for k, v in s.items() if not k.startswith("__")} for s in theirs]
    keys = [sample["__key__"] for sample in webdataset.WebDataset(urls, shardshuffle=False)]
    assert keys == [f"sample{index:05d}" for index in range(12)]
    assert fields == [
        {k: v for k, v in encoded(make_sample(i)).items() if k != "__key__"} for i in range(12)
    ]


def test_gzip_shards_round_trip_and_their_checksums_are_of_the_compressed_file(tmp_path):
    writer = write_samples(str(tmp_path / "part-%03d.tar.gz"), 9, max_count=4)
    for shard in writer.shards:
        data = Path(shard.url).read_bytes()
        assert data[:2] == b"\x1f\x8b"
        assert hashlib.sha256(data).hexdigest() == shard.sha256 and len(data) == shard.size
    read = without_url(ShardDataset([s.url for s in writer.shards], shuffle_shards=False))
    assert read == [encoded(make_sample(index)) for index in range(9)]


def test_max_size_rolls_over_before_a_shard_would_exceed_it(tmp_path):
    writer = write_samples(str(tmp_path / "s-%04d.tar"), 40, max_size="20KB")
    sizes = [os.path.getsize(shard.url) for shard in writer.shards]
    assert len(sizes) > 3 and max(sizes) <= 20_000
    assert sum(shard.samples for shard in writer.shards) == 40


def test_a_sample_larger_than_max_size_gets_a_shard_of_its_own(tmp_path):
    with ShardWriter(str(tmp_path / "s-%04d.tar"), max_size=4096) as writer:
        writer.write({"__key__": "small", "bin": b"x"})
        writer.write({"__key__": "huge", "bin": b"y" * 10_000})
        writer.write({"__key__": "after", "bin": b"z"})
    assert [shard.samples for shard in writer.shards] == [1, 1, 1]


def test_manifest_and_counts_lie_beside_the_shards_in_the_formats_readers_take(tmp_path):
    writer = write_samples(str(tmp_path / "train-%06d.tar"), 25, max_count=10, start_shard=3)
    names = ["train-000003.tar", "train-000004.tar", "train-000005.tar"]
    lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
    digests = [hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() for name in names]
    assert lines == [f"{digest}  {name}" for digest, name in zip(digests, names, strict=True)]
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True)
    assert check.returncode == 0, check.stdout
    assert writer.counts_url == str(tmp_path / "sample-counts.json")
    assert load_sample_counts(writer.counts_url) == dict(zip(names, [10, 10, 5], strict=True))
    assert sorted(os.listdir(tmp_path)) == sorted(
        [*names, "SHA256SUMS", "SHA256SUMS.blocks", "sample-counts.json", "sample-index.json"]
    )
    blocks = parse_block_manifest((tmp_path / "SHA256SUMS.blocks").read_text())
    assert list(blocks) == names
    for name, shard in zip(names, writer.shards, strict=True):
        data = (tmp_path / name).read_bytes()
        listed = blocks[name]
        assert listed == shard.blocks and listed.sha256 == shard.sha256
        assert all(listed.matches(i, data[slice(*listed.bounds(i))]) for i in range(len(listed)))


def test_block_size_of_the_block_manifest_is_a_parameter_and_none_writes_none(tmp_path):
    writer = write_samples(str(tmp_path / "a" / "s-%02d.tar"), 4, manifest_block_size=4096)
    text = (tmp_path / "a" / "SHA256SUMS.blocks").read_text()
    assert parse_block_manifest(text)["s-00.tar"].block_size == 4096
    assert len(writer.shards[0].blocks) == -(-writer.shards[0].size // 4096)
    write_samples(str(tmp_path / "b" / "s-%02d.tar"), 4, manifest_block_size=None)
    assert not (tmp_path / "b" / "SHA256SUMS.blocks").exists()
    with pytest.raises(ValueError, match="block size must be at least 4096"):
        ShardWriter(str(tmp_path / "c-%02d.tar"), manifest_block_size=100)


def test_a_misspelt_keyword_is_named_and_a_signed_pattern_stays_secret(tmp_path):
    with pytest.raises(TypeError, match="maxcount"):
        ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=3)
    with pytest.raises(TypeError, match="maxcount") as raised:
        ShardWriter("s3://bucket/s-%02d.tar?X-Amz-Signature=abc123secret", maxcount=3)
    assert "abc123secret" not in str(raised.value)


def run_cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, FSSPEC_SHARDS_CACHE=str(cache))
    command = [sys.executable, "-m", "fsspec_shards", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)


def test_the_manifest_passes_fsspec_shards_verify_and_a_changed_shard_fails_it(tmp_path):
    out = tmp_path / "out"
    writer = write_samples(str(out / "train-%06d.tar"), 25, max_count=10)
    pattern = str(out / "train-{000000..000002}.tar")
    result = run_cli("verify", pattern, "--manifest", writer.manifest_url, cache=tmp_path / "c")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 ok, 0 bad (25 samples" in result.stdout
    with ShardWriter(str(out / "train-%06d.tar"), start_shard=1, manifest=None) as rewrite:
        rewrite.write(make_sample(99))
    result = run_cli("verify", pattern, "--manifest", writer.manifest_url, cache=tmp_path / "c")
    assert result.returncode == 1 and "train-000001.tar" in result.stdout


def test_counts_make_even_epochs_over_ranks(tmp_path, monkeypatch):
    writer = write_samples(str(tmp_path / "train-%06d.tar"), 23, max_count=4)
    pattern = str(tmp_path / "train-{000000..000005}.tar")
    assert [shard.samples for shard in writer.shards] == [4, 4, 4, 4, 4, 3]
    seen, lengths = set(), []
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "4")
        dataset = ShardDataset(
            pattern, seed=1, samples_per_shard=writer.counts_url, equalize="pad", prefetch=0
        )
        keys = [sample["__key__"] for sample in dataset]
        lengths.append(len(keys))
        seen.update(keys)
    assert len(set(lengths)) == 1
    assert seen == {f"sample{index:05d}" for index in range(23)}


def test_an_error_inside_the_block_publishes_no_partial_shard_and_no_manifest(tmp_path):
    with (
        pytest.raises(RuntimeError, match="stop"),
        ShardWriter(str(tmp_path / "t-%02d.tar"), max_count=3) as writer,
    ):
        for index in range(5):
            writer.write(make_sample(index))
        raise RuntimeError("stop")
    assert sorted(os.listdir(tmp_path)) == ["t-00.tar"]
    assert [shard.samples for shard in writer.shards] == [3]
    with pytest.raises(ValueError, match="closed"):
        writer.write(make_sample(9))


def test_a_refused_sample_writes_nothing_and_the_writer_goes_on(tmp_path):
    with ShardWriter(str(tmp_path / "t-%02d.tar")) as writer:
        writer.write(make_sample(0))
        with pytest.raises(ValueError, match="repeats the previous sample's key"):
            writer.write(make_sample(0))
        with pytest.raises(ValueError, match="reads back as key 'a'"):
            writer.write({"__key__": "a.b", "txt": "x"})
        with pytest.raises(ValueError, match="no encoding of int"):
            writer.write({"__key__": "c", "txt": "ok", "bin": 5})
        writer.write(make_sample(1))
    read = without_url(ShardDataset(str(tmp_path / "t-00.tar"), shuffle_shards=False))
    assert read == [encoded(make_sample(0)), encoded(make_sample(1))]


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("out/train.tar", "one integer placeholder"),
        ("out-%d/train-%d.tar", "one integer placeholder"),
        ("out/train-%s-%d.tar", "one integer placeholder"),
        ("out/train-%06d\n.tar", "no newline"),
    ],
)
def test_a_pattern_without_one_file_name_placeholder_is_refused(tmp_path, pattern, message):
    with pytest.raises(ValueError, match=message):
        ShardWriter(str(tmp_path / pattern))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_count": 0}, "max_count"),
        ({"max_count": True}, "max_count"),
        ({"max_size": "lots"}, "max_size"),
        ({"max_size": 0}, "max_size"),
        ({"start_shard": -1}, "start_shard"),
        ({"manifest": "sub/SHA256SUMS"}, "manifest must be a file name"),
        ({"counts": ""}, "counts must be a file name"),
        ({"max_member_size": "huge"}, "max_member_size"),
    ],
)
def test_invalid_limits_are_refused_naming_the_option(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        ShardWriter(str(tmp_path / "s-%d.tar"), **options)


def test_equal_samples_make_byte_identical_shards(tmp_path):
    first = write_samples(str(tmp_path / "a" / "s-%d.tar"), 6)
    second = write_samples(str(tmp_path / "b" / "s-%d.tar"), 6)
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]


def test_long_and_unicode_names_are_written_as_pax_and_read_back(tmp_path):
    key = "deep/" * 30 + "ключ"
    with ShardWriter(str(tmp_path / "s-%d.tar")) as writer:
        writer.write({"__key__": key, "seg.png": b"png", "txt": "t"})
    with tarfile.open(writer.shards[0].url) as archive:
        assert archive.getnames() == [f"{key}.seg.png", f"{key}.txt"]
    (sample,) = ShardDataset(writer.shards[0].url)
    assert (sample["__key__"], sample["seg.png"], sample["txt"]) == (key, b"png", b"t")


def test_writing_through_wds_drops_the_cached_copy_of_an_overwritten_shard(tmp_path):
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}}
    url = f"wds::{(tmp_path / 'out').as_uri()}/s-%d.tar"
    with ShardWriter(url, storage_options=options) as writer:
        writer.write({"__key__": "old", "txt": "old"})
    shard = url % 0
    assert [s["txt"] for s in ShardDataset(shard, storage_options=options)] == [b"old"]
    with ShardWriter(url, storage_options=options) as writer:
        writer.write({"__key__": "new", "txt": "new"})
    assert [s["txt"] for s in ShardDataset(shard, storage_options=options)] == [b"new"]


KILLED_WRITER = """
import sys, time
from pathlib import Path
from fsspec_shards import ShardWriter

directory, prefix, ready = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
writer = ShardWriter(str(directory / f"{prefix}-%03d.tar"), max_count=50, manifest=prefix)
for index in range(120):
    writer.write({"__key__": f"s{index:04d}", "bin": bytes(2000)})
    if index == 75:
        ready.write_text("mid-shard")
        time.sleep(600)
"""


def start_writer(directory: Path, prefix: str) -> subprocess.Popen:
    """A writer subprocess stopped in the middle of its second shard."""
    ready = directory.parent / f"{prefix}.ready"
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(directory), prefix, str(ready)]
    )
    deadline = time.monotonic() + TIMEOUT
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the writer {prefix} did not get mid-shard")
        time.sleep(0.05)
    return process


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(TIMEOUT)


def spool_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.glob(".fsspec-shards-spool-*/*/*"))


def test_a_killed_writer_leaves_only_complete_shards_and_the_next_writer_its_spool(tmp_path):
    """SIGKILL mid-shard: no partial shard under a final name; the next writer removes the
    dead writer's spool and never a live writer's."""
    directory = tmp_path / "out"
    directory.mkdir()
    kill(start_writer(directory, "k"))
    assert [name for name in sorted(os.listdir(directory)) if name[0] != "."] == ["k-000.tar"]
    [dead] = spool_files(directory)
    assert dead.startswith("k-001.tar.")
    live = start_writer(directory, "l")
    try:
        [live_spool] = [name for name in spool_files(directory) if name != dead]
        with ShardWriter(str(directory / "c-%03d.tar"), manifest="c", counts=None) as writer:
            assert spool_files(directory) == [live_spool]  # the dead run went, the live stayed
            writer.write({"__key__": "c", "txt": "c"})
    finally:
        kill(live)
    write_samples(str(directory / "d-%03d.tar"), 3, manifest="d", counts=None)
    assert [name for name in os.listdir(directory) if name.startswith(".")] == []
    complete = list(ShardDataset(str(directory / "k-000.tar")))
    assert [s["__key__"] for s in complete] == [f"s{index:04d}" for index in range(50)]


MANIFESTS = ["SHA256SUMS", "SHA256SUMS.blocks", "sample-counts.json", "sample-index.json"]


def test_an_aborted_run_over_earlier_shards_leaves_no_manifest_of_the_earlier_run(tmp_path):
    pattern = str(tmp_path / "t-%02d.tar")
    write_samples(pattern, 30, max_count=10)
    assert set(MANIFESTS) <= set(os.listdir(tmp_path))
    with pytest.raises(RuntimeError, match="stop"), ShardWriter(pattern, max_count=10) as writer:
        for index in range(15):
            writer.write(make_sample(100 + index))
        raise RuntimeError("stop")
    assert sorted(os.listdir(tmp_path)) == ["t-00.tar", "t-01.tar", "t-02.tar"]
    write_samples(pattern, 12, max_count=10)
    counts = load_sample_counts(str(tmp_path / "sample-counts.json"))
    assert counts == {"t-00.tar": 10, "t-01.tar": 2}
    sums = (tmp_path / "SHA256SUMS").read_text()
    assert "t-02.tar" not in sums and "t-01.tar" in sums


def test_a_member_larger_than_readers_take_is_refused_naming_key_and_field(tmp_path):
    from fsspec_shards.config import DEFAULT_MAX_MEMBER_SIZE

    with ShardWriter(str(tmp_path / "t-%02d.tar")) as writer:
        huge = bytes(DEFAULT_MAX_MEMBER_SIZE + 1)  # calloc'd: no memory is touched
        with pytest.raises(ValueError, match=r"sample 'big' field 'bin': .*max_member_size"):
            writer.write({"__key__": "big", "bin": huge})
        del huge
        writer.write({"__key__": "small", "bin": b"x"})
    small = ShardWriter(str(tmp_path / "s-%02d.tar"), max_member_size="1KiB")
    with small, pytest.raises(ValueError, match=r"'k' field 'txt.gz'"):
        small.write({"__key__": "k", "txt.gz": os.urandom(2000)})
    read = [sample["__key__"] for sample in ShardDataset(str(tmp_path / "t-00.tar"))]
    assert read == ["small"]


def test_a_lone_surrogate_is_refused_naming_key_and_field(tmp_path):
    with ShardWriter(str(tmp_path / "t-%02d.tar")) as writer:
        with pytest.raises(ValueError, match=r"sample 'k' field 'txt': .*surrogates"):
            writer.write({"__key__": "k", "txt": "caption \ud800"})
        with pytest.raises(ValueError, match=r"sample 'k\\ud800' field 'txt'"):
            writer.write({"__key__": "k\ud800", "txt": "x"})
        writer.write({"__key__": "k", "txt": "fine"})
    assert [s["txt"] for s in ShardDataset(str(tmp_path / "t-00.tar"))] == [b"fine"]


def test_a_pattern_with_a_query_keeps_it_out_of_names_and_off_the_placeholder():
    # A SAS-style query (its '%2F' no format) signs every object the writer puts, manifests
    # included; the manifests name the shards as readers look them up, without the query.
    import fsspec

    query = "?sv=2024&se=2030&sig=s3cr%2Ft"
    memory = fsspec.filesystem("memory")
    try:
        pattern = f"memory://signed/out/x-%04d.tar.gz{query}"
        with ShardWriter(pattern, max_count=2) as writer:
            for index in range(3):
                writer.write(make_sample(index))
        assert [shard.name for shard in writer.shards] == ["x-0000.tar.gz", "x-0001.tar.gz"]
        assert writer.counts_url == f"memory://signed/out/sample-counts.json{query}"
        for name in ("SHA256SUMS", "SHA256SUMS.blocks", "sample-counts.json", "sample-index.json"):
            assert b"s3cr" not in memory.cat(f"/signed/out/{name}{query}"), name
        assert memory.cat(f"/signed/out/x-0000.tar.gz{query}")[:2] == b"\x1f\x8b"  # gzip
        urls = [f"memory://signed/out/x-{index:04d}.tar.gz{query}" for index in range(2)]
        dataset = ShardDataset(urls, samples_per_shard=writer.counts_url, shuffle_shards=False)
        assert len(dataset) == 3 and [s["__key__"] for s in dataset] == [
            make_sample(index)["__key__"] for index in range(3)
        ]
    finally:
        if memory.exists("/signed"):
            memory.rm("/signed", recursive=True)


def test_a_gz_field_that_decompresses_past_max_member_size_is_refused(tmp_path):
    # 2,000 bytes of text compress to a few dozen, which readers take; decode() would then
    # refuse what they decompress to, so the writer refuses it first.
    with ShardWriter(str(tmp_path / "s-%02d.tar"), max_member_size="1KiB") as writer:
        with pytest.raises(ValueError, match=r"'k' field 'txt.gz': .*decompress"):
            writer.write({"__key__": "k", "txt.gz": "a" * 2000})
        writer.write({"__key__": "k", "txt.gz": "a" * 1000})
    decode = transforms.decode(max_member_size="1KiB")
    assert [decode(sample)["txt.gz"] for sample in ShardDataset(writer.shards[0].url)] == [
        "a" * 1000
    ]


def test_a_writer_that_cannot_start_leaves_the_earlier_runs_manifests(tmp_path):
    with ShardWriter(str(tmp_path / "t-%02d.tar")) as writer:
        writer.write(make_sample(0))
    before = {name: (tmp_path / name).read_bytes() for name in ("SHA256SUMS", "sample-counts.json")}
    area = tmp_path / f".fsspec-shards-spool-{os.geteuid()}"
    area.mkdir(mode=0o700)
    area.chmod(0o777)  # not private: the writer refuses it, and so writes nothing
    with pytest.raises(PermissionError, match="spool directory"):
        ShardWriter(str(tmp_path / "t-%02d.tar"))
    assert {name: (tmp_path / name).read_bytes() for name in before} == before


def test_a_question_mark_in_a_local_path_is_part_of_the_names(tmp_path):
    with ShardWriter(str(tmp_path / "what?-%02d.tar")) as writer:
        writer.write(make_sample(0))
    assert [shard.name for shard in writer.shards] == ["what?-00.tar"]
    assert (tmp_path / "what?-00.tar").is_file()


def test_zstd_shards_read_back_byte_identical_here_and_in_webdatasets_tar_reading(tmp_path):
    import webdataset
    import zstandard

    writer = write_samples(str(tmp_path / "z-%03d.tar.zst"), 25, max_count=10)
    names = [shard.name for shard in writer.shards]
    assert names == ["z-000.tar.zst", "z-001.tar.zst", "z-002.tar.zst"]
    expected = [encoded(make_sample(index)) for index in range(25)]
    pattern = str(tmp_path / "z-{000..002}.tar.zst")
    assert without_url(ShardDataset(pattern, shuffle_shards=False)) == expected
    plain = []
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data[:4] == b"\x28\xb5\x2f\xfd"
        tar = tmp_path / name.removesuffix(".zst")
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            tar.write_bytes(reader.read())
        plain.append(str(tar))
    theirs = webdataset.WebDataset(
        plain, shardshuffle=False, nodesplitter=None, workersplitter=None
    )
    assert [{k: v for k, v in s.items() if k != "__local_path__"} for s in without_url(theirs)] == (
        expected
    )
    plain_writer = write_samples(str(tmp_path / "p-%03d.tar"), 25, max_count=10)
    for ours, tar in zip(plain_writer.shards, plain, strict=True):  # the same tar, compressed
        assert Path(ours.url).read_bytes() == Path(tar).read_bytes()


def test_the_sample_index_the_writer_leaves_matches_a_header_scan(tmp_path):
    from fsspec_shards.iteration.reader import ShardReader
    from fsspec_shards.iteration.shard_index import index_of_samples, load_index

    for suffix in ("tar", "tar.gz", "tar.zst"):
        directory = tmp_path / suffix
        writer = write_samples(str(directory / f"s-%02d.{suffix}"), 23, max_count=10)
        written = load_index(str(directory / "sample-index.json"))
        assert list(written) == [shard.name for shard in writer.shards]
        reader = ShardReader()
        for shard in writer.shards:
            scanned = reader.samples(shard.url, headers_only=True)
            assert written[shard.name] == index_of_samples(shard.size, scanned), shard.name
