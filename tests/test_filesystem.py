"""The wds filesystem over local and in-memory backends: options, cache, verify, writes."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import fsspec
import pytest

from tests.wds_filesystem import SHARD_DATA, local_shard, planned_filesystem, wds_filesystem

DATA = SHARD_DATA


@pytest.fixture
def shard(tmp_path):
    """A local file and the options of a fresh cache directory."""
    return local_shard(tmp_path)


def test_chained_url_reads_the_backend_bytes_and_a_second_read_is_a_cache_hit(shard):
    path, options = shard
    for _ in range(2):
        with fsspec.open(f"wds::file://{path}", "rb", wds=options) as handle:
            assert handle.read() == DATA
    fs, _ = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    stats = fs.cache_stats()
    assert (stats["misses"], stats["hits"], stats["bytes_downloaded"]) == (1, 1, len(DATA))
    assert (stats["cached_files"], stats["cached_bytes"]) == (1, len(DATA))


def test_every_url_form_of_one_object_maps_to_one_instance_and_path(shard):
    path, options = shard
    fs1, p1 = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    fs2, p2 = fsspec.core.url_to_fs(f"wds::{path}", wds=options)
    assert fs1 is fs2 and p1 == p2 == path
    assert fs1.cat_file(f"wds::file://{path}", 0, 4) == fs1.cat_file(path, 0, 4) == DATA[:4]


def test_options_come_from_fsspec_config_and_explicit_arguments_win(monkeypatch, tmp_path):
    conf: dict = {}
    fsspec.config.set_conf_env(
        conf,
        {"FSSPEC_WDS_RETRIES": "3", "FSSPEC_WDS_CACHE_SIZE": "1GiB", "FSSPEC_WDS_VERIFY": "size"},
    )
    monkeypatch.setitem(fsspec.config.conf, "wds", conf["wds"])
    fs = wds_filesystem(target_protocol="file", cache_dir=str(tmp_path))
    assert (fs.policy.attempts, fs.options.cache_size, fs.options.verify) == (3, 1024**3, "size")
    fs = wds_filesystem(target_protocol="file", cache_dir=str(tmp_path), retries=7)
    assert fs.policy.attempts == 7


def test_a_request_counts_as_stalled_after_30_seconds_without_progress_by_default(tmp_path):
    assert wds_filesystem(target_protocol="file", cache_dir=str(tmp_path)).policy.timeout == 30.0
    assert (
        wds_filesystem(target_protocol="file", cache_dir=str(tmp_path), timeout=5).policy.timeout
        == 5.0
    )


def test_cache_location_and_size_default_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FSSPEC_SHARDS_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("WDS_CACHE_SIZE", "5MB")
    fs = wds_filesystem(target_protocol="file")
    assert (fs.options.cache_dir, fs.options.cache_size) == (str(tmp_path / "c"), 5_000_000)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": 0}, "retries"),
        ({"retries": "many"}, "retries"),
        ({"verify": "sha256"}, "verify"),
        ({"cache_size": "lots"}, "cache_size"),
        ({"timeout": -1}, "timeout"),
        ({"cache": "maybe"}, "cache"),
        ({"checksums": 5}, "checksums"),
        ({"checksums": {"train-0000.tar": "sha1:00"}}, "checksums entry for train-0000.tar"),
        ({"anon": True}, "unknown option.*anon"),
        ({"target_protocol": None}, "needs a backend"),
    ],
)
def test_invalid_options_raise_a_value_error_naming_the_option(options, message):
    arguments = {"target_protocol": "file", **options}
    with pytest.raises(ValueError, match=message):
        wds_filesystem(**arguments)


def test_instances_pickle_and_tokenize_stably(shard):
    path, options = shard
    fs, _ = fsspec.core.url_to_fs(f"wds::file://{path}", wds=options)
    clone = pickle.loads(pickle.dumps(fs))
    assert clone._fs_token == fs._fs_token
    assert clone.cat_file(path) == DATA
    other = wds_filesystem(target_protocol="file", cache_dir=options["cache_dir"], retries=2)
    assert other._fs_token != fs._fs_token


def test_fresh_interpreter_resolves_wds_urls_without_importing_the_package(shard):
    path, options = shard
    script = textwrap.dedent(
        f"""
        import sys, fsspec
        assert "fsspec_shards" not in sys.modules
        with fsspec.open("wds::file://{path}", "rb", wds={options!r}) as f:
            data = f.read()
        print(len(data), type(f).__name__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.split()[0] == str(len(DATA))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ranged_reads": "sometimes"}, "ranged_reads"),
        ({"ranged_reads": "cache", "cache": False}, "direct"),
    ],
)
def test_ranged_reads_option_is_checked(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        wds_filesystem(target_protocol="file", cache_dir=str(tmp_path), **options)


def test_transport_option_is_checked_and_named(tmp_path):
    with pytest.raises(ValueError, match="'transport'.*auto, obstore, fsspec"):
        wds_filesystem(target_protocol="file", cache_dir=str(tmp_path), transport="fast")
    pytest.importorskip("obstore")
    with pytest.raises(ValueError, match="transport='obstore' cannot serve 'file'"):
        wds_filesystem(target_protocol="file", cache_dir=str(tmp_path), transport="obstore")


def test_transport_comes_from_the_environment(monkeypatch, tmp_path):
    conf: dict = {}
    fsspec.config.set_conf_env(conf, {"FSSPEC_WDS_TRANSPORT": "fsspec"})
    monkeypatch.setitem(fsspec.config.conf, "wds", conf["wds"])
    fs = wds_filesystem(target_protocol="http", cache_dir=str(tmp_path))
    assert fs.options.transport == "fsspec"
    assert type(fs.download_transport.backend).__name__ == "HttpBackend"  # fsspec's stream


def test_cat_ranges_reports_a_missing_path_without_failing_the_others(tmp_path):
    fs, _, path = planned_filesystem(tmp_path)
    results = fs.cat_ranges([path, path + ".missing"], [0, 0], [3, 3])
    assert results[0] == DATA[:3] and isinstance(results[1], FileNotFoundError)


def test_writes_go_to_the_backend_and_drop_the_cached_copy(shard):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", **options)
    assert fs.cat_file(path) == DATA
    fs.pipe_file(path, b"new content")
    assert fs.cat_file(path) == b"new content"
    with fs.open(path, "wb") as handle:
        handle.write(b"written")
    assert fs.cat_file(path) == b"written"
    with fs.open(path, "w") as handle:
        handle.write("text")
    assert fs.cat_file(path) == b"text"
    fs.rm(path)
    assert not fs.exists(path)
    with pytest.raises(FileNotFoundError, match="train-0000.tar"):
        fs.cat_file(path)
    assert fs.cache_stats()["cached_files"] == 0


def test_listing_calls_agree_with_the_backend(shard):
    path, options = shard
    fs = wds_filesystem(target_protocol="file", **options)
    local = fsspec.filesystem("file")
    folder = os.path.dirname(path)
    assert fs.ls(folder, detail=False) == local.ls(folder, detail=False)
    assert fs.find(folder) == local.find(folder)
    assert fs.glob(folder + "/*.tar") == local.glob(folder + "/*.tar")
    assert fs.info(path)["size"] == local.info(path)["size"] == fs.size(path)
    assert fs.exists(path) and not fs.exists(path + ".nope")
    assert fs.isdir(folder) and fs.isfile(path) and not fs.isfile(folder)
    assert fs.ukey(path) == local.ukey(path)
    assert fs.modified(path) == local.modified(path)


def test_an_invalid_target_options_value_is_rejected_without_showing_its_secrets():
    with pytest.raises(ValueError, match="target_options") as raised:
        wds_filesystem(
            target_protocol="file", target_options='{"key": "AKIA", "secret": "hunter2"}'
        )
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("cache", [True, False])
def test_open_files_pickle_and_reopen_at_their_position(shard, cache):
    """As fsspec's own files do: dask ships open file objects to its workers."""
    path, options = shard
    fs = wds_filesystem(target_protocol="file", cache=cache, **options)
    with fs.open(path) as handle:
        handle.seek(1000)
        assert handle.read(10) == DATA[1000:1010]
        with pickle.loads(pickle.dumps(handle)) as clone:
            assert clone.tell() == 1010
            assert clone.read(10) == DATA[1010:1020]


def test_a_misspelt_backend_option_is_refused_when_the_filesystem_is_made(tmp_path):
    from fsspec_shards.errors import OptionError

    with pytest.raises(OptionError, match=r"invalid storage option s3\.endpoint_urll") as error:
        fsspec.filesystem(
            "wds",
            target_protocol="s3",
            target_options={"endpoint_urll": "http://127.0.0.1:9", "skip_instance_cache": True},
            cache_dir=str(tmp_path / "cache"),
        )
    assert "did you mean 'endpoint_url'" in str(error.value)


def test_sections_reach_the_layer_and_the_backend_and_others_are_dropped(tmp_path):
    fs = fsspec.filesystem(
        "wds",
        target_protocol="file",
        target_options={"auto_mkdir": True},
        wds={"cache_dir": str(tmp_path / "cache"), "retries": 2},
        s3={"endpoint_url": "http://never-used.invalid"},
        skip_instance_cache=True,
    )
    assert fs.options.cache_dir == str(tmp_path / "cache")
    assert fs.policy.attempts == 2
    assert fs.fs.auto_mkdir is True
    (tmp_path / "a.bin").write_bytes(b"abc")
    assert fs.cat_file(str(tmp_path / "a.bin")) == b"abc"


# --------------------------------------------------------------------------- from_url

RESOLVED_AS_URL_TO_FS = [
    ("wds::s3://bucket/a/b.tar", {}),
    ("wds::s3://bucket/a/b.tar", {"s3": {"anon": True}}),
    ("wds::s3://bucket/a/b.tar", {"wds": {"cache": False}, "s3": {"anon": True, "key": None}}),
    ("wds::s3a://bucket/a/", {"s3a": {"anon": True}}),
    ("wds::gcs://bucket/x.tar", {"gcs": {"token": "anon"}}),
    ("wds::gs://bucket/x.tar", {"wds": {"retries": 2}, "gs": {"token": "anon"}}),
    ("wds::file:///data/x.tar", {}),
    ("wds::file:///data/x.tar", {"wds": {"cache": False}, "file": {"auto_mkdir": True}}),
    ("wds::https://example.com/a/b.tar", {}),
    ("wds::https://example.com/a/b.tar", {"https": {"headers": {"a": "b"}}}),
    ("wds::http://example.com:8080/a/b.tar", {"wds": {"verify": "off"}}),
]


@pytest.mark.parametrize(("url", "options"), RESOLVED_AS_URL_TO_FS)
def test_from_url_gives_what_url_to_fs_gives(url, options):
    """The same cached instance and path as fsspec's chain resolution (the backend's class
    imported: without, only S3 is resolved, by its stand-in; see the integration test)."""
    fsspec.get_filesystem_class(fsspec.core.split_protocol(url[len("wds::") :])[0])
    cls = fsspec.get_filesystem_class("wds")
    found = cls.from_url(url, **options)
    assert found is not None
    expected = fsspec.core.url_to_fs(url, **options)
    assert found[1] == expected[1]
    assert found[0] is expected[0]


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("wds::s3://bucket/k.tar?versionId=1", {}),
        ("wds::https://example.com/k.tar?token=1", {}),
        ("wds::https://example.com/k.tar#part", {}),
        ("wds::simplecache::s3://bucket/k.tar", {}),
        ("wds::/data/x.tar", {}),
        ("wds::s3://bucket", {"s3": {"anon": True}, "gcs": {}}),
        ("wds::s3://bucket/k.tar", {"cache": False}),
        ("wds::s3://bucket/k.tar", {"protocol": "s3"}),
        ("wds::s3://bucket/k.tar", {"wds": {"target_protocol": "s3"}}),
        ("s3://bucket/k.tar", {}),
        ("simplecache::s3://bucket/k.tar", {}),
    ],
)
def test_from_url_leaves_anything_unusual_to_url_to_fs(url, options):
    assert fsspec.get_filesystem_class("wds").from_url(url, **options) is None
