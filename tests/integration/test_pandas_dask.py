"""pandas and dask read parquet and csv through ``wds::`` URLs against an S3 server (moto)."""

from __future__ import annotations

import io

import dask
import dask.dataframe as dd
import pandas as pd
import pytest

from tests.integration import servers

FRAME = pd.DataFrame({"key": [f"sample-{i:04d}" for i in range(500)], "label": range(500)})


def _storage_options(backend: servers.S3Backend, tmp_path) -> dict:
    return {
        "wds": {"cache_dir": str(tmp_path / "cache"), "backoff": 0.01},
        "s3": backend.storage_options,
    }


def test_pandas_reads_parquet_and_csv_through_wds(s3_backend, tmp_path):
    parquet = io.BytesIO()
    FRAME.to_parquet(parquet, index=False)
    url = s3_backend.put("table.parquet", parquet.getvalue())
    csv_url = s3_backend.put("table.csv", FRAME.to_csv(index=False).encode())
    options = _storage_options(s3_backend, tmp_path)
    pd.testing.assert_frame_equal(pd.read_parquet(f"wds::{url}", storage_options=options), FRAME)
    pd.testing.assert_frame_equal(pd.read_csv(f"wds::{csv_url}", storage_options=options), FRAME)


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_dask_reads_csv_parts_through_wds_on_threads_and_processes(s3_backend, tmp_path, scheduler):
    for part in range(3):
        rows = FRAME.iloc[part * 100 : (part + 1) * 100]
        s3_backend.put(f"parts/part-{part}.csv", rows.to_csv(index=False).encode())
    pattern = f"wds::{s3_backend.url('parts')}/part-*.csv"
    frame = dd.read_csv(pattern, storage_options=_storage_options(s3_backend, tmp_path))
    with dask.config.set(scheduler=scheduler):
        result = frame.compute().reset_index(drop=True)
    assert result.to_dict("list") == FRAME.iloc[:300].to_dict("list")


def test_dask_reads_parquet_through_wds(s3_backend, tmp_path):
    parquet = io.BytesIO()
    FRAME.to_parquet(parquet, index=False)
    url = s3_backend.put("table.parquet", parquet.getvalue())
    frame = dd.read_parquet(f"wds::{url}", storage_options=_storage_options(s3_backend, tmp_path))
    # the threaded scheduler named, as test_ecosystem's test_dask does: a distributed Client
    # another test closed under load can leave dask's global default pointing at it
    assert frame.compute(scheduler="threads").to_dict("list") == FRAME.to_dict("list")
