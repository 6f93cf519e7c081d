"""Hugging Face ``datasets.load_dataset`` reads ``wds::`` data files from real servers.

The parquet, csv, json and webdataset builders, streaming and not, on S3 (moto), GCS (the
emulator) and HTTP (nginx); a second read comes from our cache (no byte downloaded again).
See docs/huggingface-datasets.md for the two URL spellings and why.
"""

from __future__ import annotations

import io
import json
import tarfile

import fsspec
import pandas as pd
import pytest

datasets = pytest.importorskip("datasets")

FRAME = pd.DataFrame({"id": range(20), "text": [f"row {i}" for i in range(20)]})
ROWS = FRAME.to_dict("records")
SAMPLES = [{"__key__": f"s{i:03d}", "txt": f"hello {i}", "json": {"i": i}} for i in range(4)]

BUILDERS = {
    "parquet": ("table.parquet", lambda: _parquet(FRAME)),
    "csv": ("table.csv", lambda: FRAME.to_csv(index=False).encode()),
    "json": ("table.jsonl", lambda: FRAME.to_json(orient="records", lines=True).encode()),
    "webdataset": ("shards/train-000.tar", lambda: _tar(SAMPLES)),
}


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _tar(samples: list[dict]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for sample in samples:
            for extension in ("txt", "json"):
                value = sample[extension]
                data = (json.dumps(value) if extension == "json" else value).encode()
                member = tarfile.TarInfo(f"{sample['__key__']}.{extension}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _expected(builder: str) -> list[dict]:
    if builder == "webdataset":
        return [{k: s[k] for k in ("__key__", "txt", "json")} for s in SAMPLES]
    return ROWS


def _rows(dataset, builder: str) -> list[dict]:
    rows = list(dataset)
    if builder == "webdataset":
        return [{k: row[k] for k in ("__key__", "txt", "json")} for row in rows]
    return rows


def _load(url: str, builder: str, options: dict, streaming: bool, tmp_path, run: int):
    return datasets.load_dataset(
        builder,
        data_files=url,
        storage_options=options,
        streaming=streaming,
        split="train",
        cache_dir=str(tmp_path / f"hf-{run}"),
    )


def _cache_stats(cache_dir) -> dict:
    fs = fsspec.filesystem("wds", target_protocol="file", cache_dir=str(cache_dir))
    return fs.cache_stats()


@pytest.mark.parametrize("streaming", [False, True], ids=["download", "streaming"])
@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_load_dataset_reads_s3_through_wds_and_its_cache(s3_backend, tmp_path, builder, streaming):
    name, make = BUILDERS[builder]
    url = s3_backend.put(name, make())
    cache_dir = tmp_path / "wds-cache"
    options = {"wds": {"cache_dir": str(cache_dir)}, "s3": s3_backend.storage_options}
    # "wds://::" names the layer's hop with its "://", so datasets gives it the wds section
    # and streams it (docs/huggingface-datasets.md); a glob works as with any protocol
    pattern = "wds://::" + url.replace("train-000", "train-*")
    first = _rows(_load(pattern, builder, options, streaming, tmp_path, 1), builder)
    assert first == _expected(builder)
    downloaded = _cache_stats(cache_dir)["bytes_downloaded"]
    assert downloaded >= len(make())
    second = _rows(_load(pattern, builder, options, streaming, tmp_path, 2), builder)
    assert second == first
    stats = _cache_stats(cache_dir)
    assert stats["bytes_downloaded"] == downloaded  # the second read made no download
    assert stats["hits"] >= 1


@pytest.mark.parametrize("builder", ["parquet", "webdataset"])
def test_load_dataset_takes_the_plain_chain_spelling_when_downloading(
    s3_backend, tmp_path, monkeypatch, builder
):
    """``wds::s3://...`` as in fsspec's docs: datasets 5.2 drops the ``wds`` section for it
    (the layer's options then come from fsspec's config), and repeats the last hop of the
    resolved file; the filesystem unwraps that second chain instead of handing s3fs a
    ``target_options`` keyword."""
    name, make = BUILDERS[builder]
    url = s3_backend.put(name, make())
    cache_dir = tmp_path / "wds-cache"
    monkeypatch.setitem(fsspec.config.conf, "wds", {"cache_dir": str(cache_dir)})
    options = {"wds": {"cache_dir": "/nonexistent/never-used"}, "s3": s3_backend.storage_options}
    dataset = _load(f"wds::{url}", builder, options, False, tmp_path, 1)
    assert _rows(dataset, builder) == _expected(builder)
    assert _cache_stats(cache_dir)["cached_files"] == 1


def test_load_dataset_streaming_the_plain_chain_spelling_fails_upstream(s3_backend, tmp_path):
    """The upstream part: datasets' ``xopen`` takes the first hop ``wds`` of a streamed file
    for a local path. When this starts to pass, docs/huggingface-datasets.md can drop the
    ``wds://::`` advice for streaming."""
    url = s3_backend.put("table.parquet", _parquet(FRAME))
    options = {"wds": {"cache_dir": str(tmp_path / "c")}, "s3": s3_backend.storage_options}
    with pytest.raises(FileNotFoundError, match="'wds'"):
        list(_load(f"wds::{url}", "parquet", options, True, tmp_path, 1))


@pytest.mark.parametrize("streaming", [False, True], ids=["download", "streaming"])
def test_load_dataset_reads_gcs_through_wds(gcs_backend, tmp_path, streaming):
    url = gcs_backend.put("table.parquet", _parquet(FRAME))
    assert url.startswith("gcs://")
    cache_dir = tmp_path / "wds-cache"
    options = {"wds": {"cache_dir": str(cache_dir)}, "gcs": gcs_backend.storage_options}
    rows = _rows(_load(f"wds://::{url}", "parquet", options, streaming, tmp_path, 1), "parquet")
    assert rows == ROWS
    assert _cache_stats(cache_dir)["cached_files"] == 1


def test_load_dataset_http_data_files_lose_the_layer_upstream(http_backend, tmp_path):
    """The upstream part for http(s): datasets' resolver keeps a globbed path that holds
    "://" as it is, so ``wds://::http://host/t.jsonl`` resolves to ``http://host/t.jsonl``
    repeated (``http://...::http://...``), without the layer, and fsspec's HTTP filesystem
    is handed the second hop's ``target_options``. docs/huggingface-datasets.md gives the
    working route (a ``datasets.Dataset`` built from files opened through ``wds::``); when
    this starts to fail, http(s) data files work and the docs can say so."""
    url = http_backend.put("table.jsonl", BUILDERS["json"][1]())
    options = {"wds": {"cache_dir": str(tmp_path / "c")}}
    with pytest.raises(FileNotFoundError, match="table.jsonl"):
        _load(f"wds://::{url}", "json", options, False, tmp_path, 1)


def test_http_files_opened_through_wds_feed_a_dataset(http_backend, tmp_path):
    url = http_backend.put("table.jsonl", BUILDERS["json"][1]())
    cache_dir = tmp_path / "wds-cache"
    with fsspec.open(f"wds::{url}", "rb", wds={"cache_dir": str(cache_dir)}) as handle:
        frame = pd.read_json(handle, lines=True)
    dataset = datasets.Dataset.from_pandas(frame, preserve_index=False)
    assert list(dataset) == ROWS
    assert _cache_stats(cache_dir)["cached_files"] == 1
