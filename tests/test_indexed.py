"""IndexedShardDataset on local disk and through ``wds::``: ds[i] is the i-th sample of the
shards, cold and warm, with any sampler; stale indexes and changed shards are refused."""

from __future__ import annotations

import gzip
import pickle
import random
import tarfile
from pathlib import Path

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_shards import IndexedShardDataset, ShardDataset, ShardFormatError, ShardWriter
from fsspec_shards.iteration.shard_index import DEFAULT_INDEX, format_index, load_index
from tests.shardmaker import make_tar, regular, special, zstd_compress

COMPRESSIONS = {
    "tar": lambda raw: raw,
    "tar.gz": lambda raw: gzip.compress(raw, mtime=0),
    "tar.zst": zstd_compress,
}


def without_url(sample: dict) -> dict:
    return {key: value for key, value in sample.items() if key != "__url__"}


# A shard: samples, each a list of field sizes, with a member that is no sample's part
# (a directory, a __meta__ member, a name without extension) before some of them.
samples_strategy = st.lists(
    st.tuples(
        st.lists(st.integers(0, 1500), min_size=1, max_size=3),
        st.sampled_from([None, "dir", "meta", "bare"]),
    ),
    max_size=6,
)


def shard_bytes(shard: int, samples: list) -> bytes:
    entries = []
    for number, (sizes, junk) in enumerate(samples):
        if junk == "dir":
            entries.append(special(f"d{shard}_{number}/", tarfile.DIRTYPE))
        elif junk == "meta":
            entries.append(regular("__meta__.json", b"{}"))
        elif junk == "bare":
            entries.append(regular("README", b"no extension"))
        key = f"s{shard}_{number:03d}" + ("_" + "x" * 120 if number % 4 == 3 else "")  # pax
        for field, size in enumerate(sizes):
            data = bytes([shard, number, field]) * (size // 3 + 1)
            entries.append(regular(f"{key}.f{field}", data[:size]))
    return make_tar(entries)


def write_dataset(directory: Path, shards: list, suffix: str, writer: bool) -> list[str]:
    """Shards into ``directory``: by tarfile (with members between samples) or ShardWriter
    (which leaves the sample index beside them); their paths in order."""
    if writer:
        paths = []
        for number, samples in enumerate(shards):
            pattern = str(directory / f"w{number}-%02d.{suffix}")
            with ShardWriter(pattern, max_count=10**6, index=f"{number}-{DEFAULT_INDEX}") as out:
                for sample, (sizes, _) in enumerate(samples):
                    fields = {f"f{f}": bytes([number, sample]) * s for f, s in enumerate(sizes)}
                    out.write({"__key__": f"k{number}_{sample:03d}", **fields})
            if not samples:  # a writer of no sample writes no shard: an empty tar is one
                Path(pattern % 0).write_bytes(COMPRESSIONS[suffix](make_tar([])))
            paths.append(pattern % 0)
        merged = {}
        for number in range(len(shards)):
            path = directory / f"{number}-{DEFAULT_INDEX}"
            merged.update(load_index(str(path)) if path.exists() else {})
        (directory / DEFAULT_INDEX).write_text(format_index(merged.items()))
        return paths
    paths = []
    for number, samples in enumerate(shards):
        path = directory / f"t{number}.{suffix}"
        path.write_bytes(COMPRESSIONS[suffix](shard_bytes(number, samples)))
        paths.append(str(path))
    return paths


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    shards=st.lists(samples_strategy, min_size=1, max_size=4),
    suffix=st.sampled_from(sorted(COMPRESSIONS)),
    writer=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_ds_i_is_the_ith_sample_of_the_shards_through_a_cold_and_a_warm_cache(
    tmp_path_factory, shards, suffix, writer, seed
):
    directory = tmp_path_factory.mktemp("shards")
    paths = write_dataset(directory, shards, suffix, writer)
    expected = [without_url(s) for s in ShardDataset(paths, shuffle_shards=False)]
    urls = [f"wds::file://{path}" for path in paths]
    # One cache for every example (a filesystem per cache stays alive), emptied: cold.
    options = {"wds": {"cache_dir": str(tmp_path_factory.getbasetemp() / "indexed-cache")}}
    dataset = IndexedShardDataset(urls, options)
    assert len(dataset) == len(expected)
    fs = dataset.reader.locate(urls[0])[0]
    fs.clear_cache()
    before = fs.cache_stats()
    order = list(range(len(dataset)))
    for attempt in ("cold", "warm"):
        random.Random(seed).shuffle(order)
        for number in order:
            sample = dataset[number]
            assert without_url(sample) == expected[number], (attempt, number)
            assert sample["__url__"] in urls
        if attempt == "cold":
            cold = fs.cache_stats()
    warm = fs.cache_stats()
    shard_bytes = sum(Path(path).stat().st_size for path in paths)
    downloaded = cold["bytes_downloaded"] - before["bytes_downloaded"]
    assert (downloaded > 0) == bool(expected) and downloaded <= shard_bytes  # once each at most
    assert warm["misses"] == cold["misses"]
    assert warm["bytes_downloaded"] == cold["bytes_downloaded"]


@pytest.fixture
def written(tmp_path: Path) -> str:
    """Three shards of 5, 5 and 2 samples, with the writer's sample index; their pattern."""
    with ShardWriter(str(tmp_path / "w-%02d.tar"), max_count=5) as out:
        for number in range(12):
            out.write({"__key__": f"k{number:02d}", "txt": f"text {number}", "cls": number})
    return str(tmp_path / "w-{00..02}.tar")


def test_length_negative_indices_and_bad_indices(written):
    dataset = IndexedShardDataset(written)
    assert len(dataset) == 12 and repr(dataset) == "IndexedShardDataset(3 shards, 12 samples)"
    assert dataset[-1]["__key__"] == "k11" and dataset[-12]["__key__"] == "k00"
    with pytest.raises(IndexError, match="sample index 12 out of range for 12 samples"):
        dataset[12]
    with pytest.raises(IndexError):
        dataset[-13]
    with pytest.raises(TypeError, match="integers, not slice"):
        dataset[1:3]


def test_transforms_apply_and_one_that_drops_a_sample_is_an_error(written):
    from fsspec_shards.iteration import transforms as T

    dataset = IndexedShardDataset(written, transforms=[T.decode(), T.to_tuple("txt", "cls")])
    assert dataset[7] == ("text 7", 7)
    dropping = IndexedShardDataset(written, transforms=[T.select(lambda s: s["cls"] != b"3")])
    assert dropping[2]["__key__"] == "k02"
    with pytest.raises(ValueError, match="dropped sample 3 .*cannot drop samples"):
        dropping[3]
    with pytest.raises(ValueError, match="per-sample callables"):
        IndexedShardDataset(written, transforms=[T.batched(4)])


def test_the_index_is_found_beside_given_or_built_and_a_stale_one_is_refused(written, tmp_path):
    found = IndexedShardDataset(written)
    built = IndexedShardDataset(written, index=False)
    assert found.indexes == built.indexes
    elsewhere = tmp_path / "elsewhere.json"
    (tmp_path / DEFAULT_INDEX).rename(elsewhere)
    given_path = IndexedShardDataset(written, index=elsewhere)
    assert given_path.indexes == built.indexes
    partial = load_index(str(elsewhere))
    del partial["w-01.tar"]
    assert IndexedShardDataset(written, index=partial).indexes == built.indexes
    # The shard changes after its index was written: its size tells.
    with ShardWriter(str(tmp_path / "w-%02d.tar"), max_count=6, index=None) as out:
        for number in range(12):
            out.write({"__key__": f"n{number:02d}", "txt": "changed"})
    stale = IndexedShardDataset(written, index=elsewhere)
    with pytest.raises(ValueError, match="w-00.tar is of another version of the shard"):
        stale[0]
    assert [IndexedShardDataset(written)[n]["__key__"] for n in (0, 6, 11)] == [
        "n00",
        "n06",
        "n11",
    ]


def test_an_index_that_points_between_samples_is_a_shard_format_error(written, tmp_path):
    entries = load_index(str(tmp_path / DEFAULT_INDEX))
    offsets = entries["w-00.tar"].offsets
    offsets[1] += 512  # inside sample 1's first member
    dataset = IndexedShardDataset(written, index=entries)
    with pytest.raises(ShardFormatError, match="bad header checksum, reading the range") as caught:
        dataset[1]
    assert caught.value.offset == offsets[1]
    offsets[1] = offsets[2]  # sample 0's range holds two samples, and sample 1's none
    with pytest.raises(ShardFormatError, match="no sample starts here as the sample index says"):
        dataset[0]
    with pytest.raises(ShardFormatError, match="no sample starts here"):
        dataset[1]


@pytest.mark.parametrize("suffix", ["tar.gz", "tar.zst"])
def test_a_compressed_shard_read_in_order_is_decompressed_once(tmp_path, suffix):
    with ShardWriter(str(tmp_path / f"c-%02d.{suffix}"), max_count=20) as out:
        for number in range(30):
            out.write({"__key__": f"k{number:02d}", "bin": bytes([number]) * 5000})
    dataset = IndexedShardDataset(str(tmp_path / f"c-{{00..01}}.{suffix}"))
    opened = []
    samples = dataset.reader.samples

    def counting(url, start=0, headers_only=False):
        opened.append((url.rsplit("/", 1)[-1], start))
        return samples(url, start, headers_only)

    dataset.reader.samples = counting
    keys = [dataset[number]["__key__"] for number in range(30)]
    assert keys == [f"k{number:02d}" for number in range(30)]
    assert opened == [(f"c-00.{suffix}", 0), (f"c-01.{suffix}", 0)]
    start = dataset.indexes[0].span(5)[0]
    assert dataset[5]["__key__"] == "k05"  # backwards: decompressed from the start again
    assert opened[-1] == (f"c-00.{suffix}", start)
    del dataset.reader.samples
    copy = pickle.loads(pickle.dumps(dataset))  # with a stream open: pickled without it
    assert copy[29]["__key__"] == "k29"


def test_any_sampler_drives_it_with_dataloader_workers(written):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    dataset = IndexedShardDataset(written)
    assert isinstance(dataset, Dataset)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(1)
        loader = DataLoader(dataset, sampler=sampler, num_workers=2, collate_fn=list)
        got = [sample["__key__"] for batch in loader for sample in batch]
        assert got == [f"k{number:02d}" for number in sampler]
        seen += got
    assert sorted(seen) == [f"k{number:02d}" for number in range(12)]
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=generator, collate_fn=list)
    assert sorted(s["__key__"] for batch in loader for s in batch) == sorted(set(seen))


def test_a_url_without_a_sample_index_beside_it_reads_through_a_memory_filesystem():
    memory = fsspec.filesystem("memory")
    try:
        memory.pipe("/indexed/a.tar", make_tar([regular("x.txt", b"1"), regular("y.txt", b"2")]))
        dataset = IndexedShardDataset("memory://indexed/a.tar")
        assert [dataset[n]["txt"] for n in range(len(dataset))] == [b"1", b"2"]
    finally:
        memory.rm("/indexed", recursive=True)


def test_forked_workers_do_not_share_the_open_shards_of_the_main_process(tmp_path):
    # The main process reads first, so its cached copies are open when the workers fork:
    # sharing their file offsets, two workers would read each other's samples.
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    with ShardWriter(str(tmp_path / "f-%02d.tar"), max_count=50) as out:
        for number in range(200):
            out.write({"__key__": f"k{number:03d}", "bin": bytes([number]) * 3000})
    urls = [f"wds::file://{tmp_path}/f-{shard:02d}.tar" for shard in range(4)]
    dataset = IndexedShardDataset(urls, {"wds": {"cache_dir": str(tmp_path / "cache")}})
    assert [dataset[n]["__key__"] for n in (0, 60, 120, 180)] == ["k000", "k060", "k120", "k180"]
    order = list(range(200)) * 3
    random.Random(1).shuffle(order)
    loader = DataLoader(
        dataset,
        sampler=order,
        batch_size=4,
        num_workers=3,
        collate_fn=list,
        multiprocessing_context="fork",
        generator=torch.Generator().manual_seed(0),
    )
    got = [(sample["__key__"], sample["bin"][:1]) for batch in loader for sample in batch]
    assert got == [(f"k{n:03d}", bytes([n])) for n in order]


def test_a_missing_shard_or_a_broken_one_names_it_when_indexed(tmp_path):
    missing = str(tmp_path / "absent.tar")
    with pytest.raises(FileNotFoundError, match="absent.tar"):
        IndexedShardDataset([missing])
    broken = tmp_path / "broken.tar"
    broken.write_bytes(make_tar([regular("a.txt", b"1" * 2000)])[:1000])
    with pytest.raises(ShardFormatError, match="broken.tar at byte 0: truncated member"):
        IndexedShardDataset([str(broken)])


def test_errors_never_show_the_signature_of_a_signed_url():
    url = "memory://indexed-secret/x.tar?X-Amz-Signature=SIGSECRET"
    with pytest.raises(FileNotFoundError) as caught:
        IndexedShardDataset([url])
    assert "x.tar" in str(caught.value) and "SIGSECRET" not in str(caught.value)
    with pytest.raises(FileNotFoundError, match="no sample index at") as caught:
        IndexedShardDataset([url], index="memory://indexed-secret/i.json?sig=SIGSECRET")
    assert "SIGSECRET" not in str(caught.value)
