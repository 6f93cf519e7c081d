"""Every example of docs/ecosystem.md, run against moto: pandas, dask, pyarrow, DuckDB,
polars, Hugging Face datasets, webdataset and torchdata.nodes read through ``wds::``, and a
second read comes from the cache (no byte downloaded again)."""

from __future__ import annotations

import gzip
import io

import fsspec
import pandas as pd
import pytest

from tests import webdataset_state
from tests.shardmaker import shard_tar

FRAME = pd.DataFrame({"user": [f"u{i % 7}" for i in range(100)], "clicks": range(100)})


@pytest.fixture
def store(s3_backend, tmp_path):
    """The tables and shards the examples read, and their ``storage_options``."""
    buffer = io.BytesIO()
    FRAME.to_parquet(buffer, index=False)
    s3_backend.put("tables/events.parquet", buffer.getvalue())
    for part in range(2):
        rows = FRAME.iloc[part * 50 : (part + 1) * 50]
        part_buffer = io.BytesIO()
        rows.to_parquet(part_buffer, index=False)
        s3_backend.put(f"tables/events/part-{part}.parquet", part_buffer.getvalue())
    csv = gzip.compress(FRAME.to_csv(index=False).encode(), mtime=0)
    s3_backend.put("tables/events.csv.gz", csv)
    for shard in range(4):
        s3_backend.put(f"shards/train-{shard:04d}.tar", shard_tar(shard, 5))
    cache_dir = str(tmp_path / "cache")
    options = {"wds": {"cache_dir": cache_dir}, "s3": s3_backend.storage_options}
    return s3_backend.url(), options, cache_dir


def _downloaded(cache_dir: str) -> int:
    fs = fsspec.filesystem("wds", target_protocol="file", cache_dir=cache_dir)
    return fs.cache_stats()["bytes_downloaded"]


def _twice(read, cache_dir: str):
    """``read()`` twice: equal results, and the second downloads nothing."""
    first = read()
    downloaded = _downloaded(cache_dir)
    assert downloaded > 0
    second = read()
    assert _downloaded(cache_dir) == downloaded
    return first, second


def test_pandas(store):
    root, storage_options, cache_dir = store

    def read():
        df = pd.read_parquet(f"wds::{root}/tables/events.parquet", storage_options=storage_options)
        # pandas infers compression from the name it is given, which through "::" it cannot
        gz = pd.read_csv(
            f"wds::{root}/tables/events.csv.gz",
            compression="gzip",
            storage_options=storage_options,
        )
        return df, gz

    (df, gz), again = _twice(read, cache_dir)
    pd.testing.assert_frame_equal(df, FRAME)
    pd.testing.assert_frame_equal(gz, FRAME)


def test_dask(store):
    dd = pytest.importorskip("dask.dataframe")
    root, storage_options, cache_dir = store

    def read():
        ddf = dd.read_parquet(
            f"wds::{root}/tables/events/*.parquet", storage_options=storage_options
        )
        # the threaded scheduler named: a distributed Client another test closed under load
        # can leave dask's global default pointing at it
        return ddf.compute(scheduler="threads").reset_index(drop=True)

    first, second = _twice(read, cache_dir)
    assert first.to_dict("list") == FRAME.to_dict("list")


def test_pyarrow(store, s3_backend):
    pq = pytest.importorskip("pyarrow.parquet")
    root, storage_options, cache_dir = store
    fs = fsspec.filesystem(
        "wds", target_protocol="s3", target_options=s3_backend.storage_options, cache_dir=cache_dir
    )
    path = f"{root.removeprefix('s3://')}/tables/events.parquet"
    first, second = _twice(lambda: pq.read_table(path, filesystem=fs), cache_dir)
    assert first.to_pandas().equals(FRAME)


def test_duckdb(store, s3_backend):
    duckdb = pytest.importorskip("duckdb")
    root, storage_options, cache_dir = store
    fs = fsspec.filesystem(
        "wds", target_protocol="s3", target_options=s3_backend.storage_options, cache_dir=cache_dir
    )
    con = duckdb.connect()
    con.register_filesystem(fs)
    query = (
        "SELECT user, sum(clicks) AS clicks FROM "
        f"read_parquet('wds://{root.removeprefix('s3://')}/tables/events.parquet') "
        "GROUP BY user ORDER BY user"
    )
    first, second = _twice(lambda: con.sql(query).fetchall(), cache_dir)
    expected = FRAME.groupby("user")["clicks"].sum().sort_index()
    assert first == list(expected.items())


def test_polars(store):
    pl = pytest.importorskip("polars")
    root, storage_options, cache_dir = store
    url = f"wds::{root}/tables/events.parquet"

    def read():
        with fsspec.open(url, "rb", **storage_options) as f:
            eager = pl.read_parquet(f)
        with fsspec.open(url, "rb", **storage_options) as f:
            lazy = pl.scan_parquet(f).filter(pl.col("clicks") >= 50).collect()
        return eager, lazy

    (eager, lazy), again = _twice(read, cache_dir)
    assert eager.to_pandas().equals(FRAME)
    assert lazy["clicks"].to_list() == list(range(50, 100))


def test_polars_cannot_take_the_url_itself(store):
    """polars reads URLs with its own object-store client and takes ``storage_options`` as
    that client's: the opened-file route above is the one that works (docs/ecosystem.md)."""
    pl = pytest.importorskip("polars")
    root, storage_options, cache_dir = store
    with pytest.raises(Exception, match="wds"):
        pl.read_parquet(f"wds::{root}/tables/events.parquet", storage_options=storage_options)


def test_huggingface_datasets(store, tmp_path):
    datasets = pytest.importorskip("datasets")
    root, storage_options, cache_dir = store

    def read():
        dataset = datasets.load_dataset(
            "parquet",
            data_files=f"wds://::{root}/tables/events.parquet",
            storage_options=storage_options,
            streaming=True,
            split="train",
            cache_dir=str(tmp_path / "hf"),
        )
        return list(dataset)

    first, second = _twice(read, cache_dir)
    assert first == FRAME.to_dict("records")


@pytest.fixture
def restored_webdataset():
    yield from webdataset_state.restored()


def test_webdataset(store, restored_webdataset):
    wds = pytest.importorskip("webdataset")
    import fsspec_shards

    root, storage_options, cache_dir = store
    fsspec_shards.patch_webdataset(storage_options=storage_options)
    urls = [f"{root}/shards/train-{shard:04d}.tar" for shard in range(4)]

    def read():
        dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        return [sample["__key__"] for sample in dataset]

    first, second = _twice(read, cache_dir)
    assert first == [f"s{shard:04d}_{index:05d}" for shard in range(4) for index in range(5)]


def test_torchdata_nodes(store):
    nodes = pytest.importorskip("torchdata.nodes")
    from fsspec_shards import ShardDataset

    root, storage_options, cache_dir = store
    pattern = f"{root}/shards/train-{{0000..0003}}.tar"  # plain s3://: the wds section says so

    def loader():
        dataset = ShardDataset(pattern, storage_options=storage_options, shuffle_shards=False)
        return nodes.Loader(nodes.Batcher(nodes.IterableWrapper(dataset), batch_size=4))

    def read():
        return [[sample["__key__"] for sample in batch] for batch in loader()]

    first, second = _twice(read, cache_dir)
    assert len(first) == 5 and all(len(batch) == 4 for batch in first)
    # resumable: the Loader's state holds the dataset's own
    interrupted = loader()
    iterator = iter(interrupted)
    seen = [next(iterator), next(iterator)]
    state = interrupted.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    keys = [[s["__key__"] for s in batch] for batch in seen + rest]
    assert keys == first
