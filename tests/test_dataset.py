"""ShardDataset: the sample stream, splitting, epochs, transforms and the error policy."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import sys
import traceback
import tracemalloc
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from fsspec_shards import ShardDataset, ShardFormatError
from fsspec_shards.iteration import transforms
from tests.shardmaker import keys, make_tar, regular, sample_bytes, write_shards


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path, 6, 5)


def test_unshuffled_stream_equals_webdatasets(shards):
    webdataset = pytest.importorskip("webdataset")
    ours = list(ShardDataset(shards, shuffle_shards=False, prefetch=0))
    theirs = list(
        webdataset.WebDataset(shards, shardshuffle=False, nodesplitter=None, workersplitter=None)
    )
    assert len(ours) == 30
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine["__key__"] == reference["__key__"]
        assert mine["__url__"] == reference["__url__"]
        assert mine["txt"] == reference["txt"] and mine["cls"] == reference["cls"]


def test_sample_fields_are_the_member_bytes(shards):
    first = next(iter(ShardDataset(shards, shuffle_shards=False)))
    assert first == {
        "__key__": "s0000_00000",
        "__url__": shards[0],
        "txt": sample_bytes(0, 0),
        "cls": b"0",
    }


def test_brace_pattern_is_expanded(tmp_path, shards):
    pattern = str(tmp_path / "shard-{0000..0005}.tar")
    assert keys(ShardDataset(pattern, seed=3)) == keys(ShardDataset(shards, seed=3))


def test_gzip_shards_give_the_same_samples(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "gz").mkdir()
    plain = write_shards(tmp_path / "plain", 3, 4)
    gz = write_shards(tmp_path / "gz", 3, 4, gz=True)

    def without_url(dataset):
        return [{k: v for k, v in sample.items() if k != "__url__"} for sample in dataset]

    assert without_url(ShardDataset(plain, seed=1)) == without_url(ShardDataset(gz, seed=1))


def test_epoch_decides_the_order(shards):
    dataset = ShardDataset(shards, seed=5, shuffle_buffer=4)
    first = keys(dataset)
    assert keys(dataset) == first
    dataset.set_epoch(1)
    second = keys(dataset)
    assert second != first and sorted(second) == sorted(first)


def test_ranks_together_yield_every_sample_exactly_once(shards, monkeypatch):
    everything = sorted(keys(ShardDataset(shards, split_by_node=False)))
    seen = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        part = keys(ShardDataset(shards, seed=2, shuffle_buffer=3))
        assert part
        seen += part
    assert sorted(seen) == everything


def test_too_few_shards_for_the_ranks_is_an_error_not_a_hang(shards, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "7")
    with pytest.raises(ValueError, match="cannot be split over 7 consumers"):
        list(ShardDataset(shards))


class MeshDimension:
    """A one-dimensional DeviceMesh as ShardDataset sees one: local rank and size."""

    ndim = 1

    def __init__(self, rank, size):
        self.rank, self.count = rank, size

    def get_local_rank(self):
        return self.rank

    def size(self):
        return self.count


def test_peers_of_one_data_parallel_index_read_identical_streams(shards, monkeypatch):
    # A 2 (data parallel) x 2 (tensor parallel) mesh: global ranks 0, 1 hold dp index 0.
    monkeypatch.setenv("WORLD_SIZE", "4")
    streams = []
    for global_rank in range(4):
        monkeypatch.setenv("RANK", str(global_rank))
        group = MeshDimension(global_rank // 2, 2)
        streams.append(keys(ShardDataset(shards, group=group, shuffle_buffer=3, seed=4)))
    assert streams[0] == streams[1] and streams[2] == streams[3]
    assert sorted(streams[0] + streams[2]) == sorted(
        keys(ShardDataset(shards, split_by_node=False))
    )


def test_explicit_rank_and_world_size_split_like_the_environment(shards, monkeypatch):
    explicit = [keys(ShardDataset(shards, rank=rank, world_size=3, seed=2)) for rank in range(3)]
    from_environment = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        from_environment.append(keys(ShardDataset(shards, seed=2)))
    assert explicit == from_environment
    with pytest.raises(ValueError, match="rank=3 must be smaller"):
        ShardDataset(shards, rank=3, world_size=3)


def test_dataset_pickles_and_iterates_the_same(shards):
    dataset = ShardDataset(shards, seed=4, shuffle_buffer=5)
    iterator = iter(dataset)
    next(iterator)
    assert keys(pickle.loads(pickle.dumps(dataset))) == keys(
        ShardDataset(shards, seed=4, shuffle_buffer=5)
    )


def test_transforms_map_and_drop_samples(shards):
    steps = [
        transforms.select(lambda sample: sample["cls"] != b"0"),
        transforms.map(lambda sample: sample["__key__"]),
    ]
    result = list(ShardDataset(shards, shuffle_shards=False, transforms=steps))
    assert result == [
        k for k in keys(ShardDataset(shards, shuffle_shards=False)) if not k.endswith("00000")
    ]


def test_batching_inside_the_dataset_is_refused(shards):
    with pytest.raises(ValueError, match="batch"):
        ShardDataset(shards, transforms=[transforms.batched(4)])


def test_invalid_arguments_are_refused(shards):
    with pytest.raises(ValueError, match="handler"):
        ShardDataset(shards, handler="ignore")
    with pytest.raises(ValueError, match="no shard URLs"):
        ShardDataset([])


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("shuffle_buffer", "x"),
        ("shuffle_buffer", 2.5),  # was 2, silently
        ("prefetch", None),
        ("seed", "a"),
        ("seed", 1.5),  # was 1, silently
        ("shuffle_buffer", -1),
        ("transforms", [1]),  # was a TypeError at the first sample
    ],
)
def test_an_argument_of_the_wrong_kind_is_a_value_error_naming_it(shards, argument, value):
    with pytest.raises(ValueError, match=argument):
        ShardDataset(shards, **{argument: value})


def test_numpy_integers_are_ints(shards):
    numpy = pytest.importorskip("numpy")
    dataset = ShardDataset(shards, seed=numpy.int64(3), shuffle_buffer=numpy.int32(2))
    assert (dataset.seed, dataset.shuffle_buffer) == (3, 2)


def test_memory_stays_bounded_on_a_large_shard(tmp_path):
    shard = write_shards(tmp_path, 1, 160, payload_size=64 * 1024)
    assert Path(shard[0]).stat().st_size > 10 * 1024 * 1024
    tracemalloc.start()
    try:
        count = sum(1 for _ in ShardDataset(shard, prefetch=0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 160
    assert peak < 4 * 1024 * 1024


# --- the error policy ---------------------------------------------------------------------


def break_shard(path: str, how: str) -> None:
    data = Path(path).read_bytes()
    if how == "missing":
        Path(path).unlink()
    elif how == "truncated":
        Path(path).write_bytes(data[: len(data) // 2 + 100])
    elif how == "corrupt":
        damaged = bytearray(data)
        damaged[3 * 1024 + 150] ^= 0x55  # the checksum field of the fourth member's header
        Path(path).write_bytes(bytes(damaged))


EXPECTED_ERROR = {
    "missing": FileNotFoundError,
    "truncated": ShardFormatError,
    "corrupt": ShardFormatError,
}


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupt"])
def test_handler_raise_names_the_broken_shard(shards, how):
    break_shard(shards[2], how)
    with pytest.raises(EXPECTED_ERROR[how]) as raised:
        list(ShardDataset(shards, shuffle_shards=False))
    shown = str(raised.value) + " ".join(getattr(raised.value, "__notes__", []))
    assert Path(shards[2]).name in shown


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupt"])
@pytest.mark.parametrize("handler, level", [("warn", logging.WARNING), ("skip", logging.DEBUG)])
def test_handler_warn_and_skip_leave_the_shard_out_and_count_it(
    shards, how, handler, level, caplog
):
    good = [
        k for k in keys(ShardDataset(shards, shuffle_shards=False)) if not k.startswith("s0002_")
    ]
    break_shard(shards[2], how)
    dataset = ShardDataset(shards, shuffle_shards=False, handler=handler)
    with caplog.at_level(logging.DEBUG, logger="fsspec_shards"):
        result = keys(dataset)
    assert [k for k in result if not k.startswith("s0002_")] == good
    assert len([k for k in result if k.startswith("s0002_")]) < 5
    stats = dataset.stats()
    assert stats["shards_failed"] == 1 and stats["shards_done"] == 5
    assert stats["samples"] == len(result)
    url, error = stats["failures"][0]
    assert url == shards[2] and isinstance(error, EXPECTED_ERROR[how])
    records = [r for r in caplog.records if "leaving out shard" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == level


SIGNED = "memory://bucket/gone.tar?X-Amz-Credential=AKIDSECRET&X-Amz-Signature=SIGSECRET"


def chain(error):
    """``error`` and every exception its ``__cause__``/``__context__`` links reach."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def test_a_failing_signed_url_never_shows_its_signature_in_errors(shards):
    with pytest.raises(FileNotFoundError) as raised:
        list(ShardDataset([shards[0], SIGNED], shuffle_shards=False))
    shown = "".join(traceback.format_exception(raised.value))
    shown += " ".join(str(link) for link in chain(raised.value))
    assert "gone.tar" in shown
    assert "SIGSECRET" not in shown and "AKIDSECRET" not in shown


def test_a_skipped_signed_url_never_shows_its_signature_in_logs_or_stats(shards, caplog):
    dataset = ShardDataset([shards[0], SIGNED], shuffle_shards=False, handler="warn")
    with caplog.at_level(logging.DEBUG, logger="fsspec_shards"):
        assert len(keys(dataset)) == 5
    ((url, error),) = dataset.stats()["failures"]
    assert isinstance(error, FileNotFoundError)
    shown = caplog.text + url + "".join(traceback.format_exception(error))
    assert "gone.tar" in shown
    assert "SIGSECRET" not in shown and "AKIDSECRET" not in shown


def _run_python(program: str, *args: str) -> subprocess.CompletedProcess:
    """``program`` in a fresh interpreter from the project root; it must succeed."""
    result = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 0, result.stderr
    return result


def test_without_torch_the_dataset_is_a_plain_iterable(shards):
    program = (
        "import sys, json; sys.modules['torch'] = None\n"
        "from fsspec_shards import ShardDataset\n"
        "ds = ShardDataset(json.loads(sys.argv[1]), shuffle_buffer=2)\n"
        "assert ShardDataset.__mro__[1] is object\n"
        "print(len(list(ds)))\n"
    )
    result = _run_python(program, json.dumps(shards))
    assert result.stdout.strip() == "30"


def test_package_import_loads_no_torch_and_iteration_never_imports_storage(shards):
    program = (
        "import sys, json, pkgutil, importlib\n"
        "import fsspec_shards\n"
        "assert 'torch' not in sys.modules, 'import fsspec_shards loaded torch'\n"
        "import fsspec_shards.iteration as iteration\n"
        "for module in pkgutil.iter_modules(iteration.__path__):\n"
        "    importlib.import_module('fsspec_shards.iteration.' + module.name)\n"
        "print(sum(1 for _ in fsspec_shards.ShardDataset(json.loads(sys.argv[1]))))\n"
        "print(sorted(m for m in sys.modules if m.startswith('fsspec_shards.storage')))\n"
    )
    result = _run_python(program, json.dumps(shards))
    assert result.stdout.split("\n")[:2] == ["30", "[]"]


# --- per-sample errors, progress lines, poisoned shards -------------------------------------


@pytest.fixture
def bad_labels(tmp_path):
    """Two shards of four samples; two samples' ``cls`` is not a number."""
    urls = []
    for shard in range(2):
        entries = []
        for index in range(4):
            label = b"x" if (shard, index) in ((0, 1), (1, 3)) else str(index).encode()
            entries += [
                regular(f"k{shard}_{index}.txt", b"text"),
                regular(f"k{shard}_{index}.cls", label),
            ]
        path = tmp_path / f"labels-{shard}.tar"
        path.write_bytes(make_tar(entries))
        urls.append(str(path))
    return urls


def test_a_sample_that_fails_to_decode_raises_naming_shard_and_key(bad_labels):
    dataset = ShardDataset(bad_labels, shuffle_shards=False, transforms=[transforms.decode()])
    with pytest.raises(ValueError, match="cannot decode field 'cls'") as raised:
        list(dataset)
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "sample 'k0_1' of shard" in notes and "labels-0.tar" in notes


@pytest.mark.parametrize("handler, level", [("warn", logging.WARNING), ("skip", logging.DEBUG)])
def test_samples_that_fail_to_decode_are_left_out_logged_and_counted(
    bad_labels, handler, level, caplog
):
    dataset = ShardDataset(
        bad_labels, shuffle_shards=False, handler=handler, transforms=[transforms.decode()]
    )
    with caplog.at_level(logging.DEBUG, logger="fsspec_shards"):
        result = [sample["__key__"] for sample in dataset]
    assert result == ["k0_0", "k0_2", "k0_3", "k1_0", "k1_1", "k1_2"]
    stats = dataset.stats()
    assert stats["sample_errors"] == {"ValueError": 2} and stats["samples"] == 6
    assert [(Path(url).name, key) for url, key, _ in stats["sample_failures"]] == [
        ("labels-0.tar", "k0_1"),
        ("labels-1.tar", "k1_3"),
    ]
    records = [r for r in caplog.records if "leaving out sample" in r.getMessage()]
    assert len(records) == 2 and {r.levelno for r in records} == {level}
    assert "'k1_3' of shard" in records[1].getMessage() and "ValueError" in records[1].getMessage()


def test_a_skipped_sample_still_counts_for_exact_resumption(bad_labels):
    args = dict(
        urls=bad_labels, shuffle_buffer=3, seed=1, handler="skip", transforms=[transforms.decode()]
    )
    expected = keys(ShardDataset(**args))
    for cut in range(len(expected) + 1):
        dataset = ShardDataset(**args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        resumed = ShardDataset(**args)
        resumed.load_state_dict(dataset.state_dict())
        assert head + keys(resumed) == expected


def test_the_progress_line_reports_samples_cache_hit_rate_rate_and_retries(tmp_path, caplog):
    paths = write_shards(tmp_path, 3, 5)
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}}
    urls = [f"wds::file://{path}" for path in paths]
    list(ShardDataset(urls, storage_options=options))
    dataset = ShardDataset(urls, storage_options=options, log_interval=1e-6)
    with caplog.at_level(logging.INFO, logger="fsspec_shards.dataset"):
        assert len(list(dataset)) == 15
    lines = [r.getMessage() for r in caplog.records if "samples/s" in r.getMessage()]
    assert lines and lines[-1].startswith("rank 0 worker 0: 15 samples,")
    assert "MB/s read" in lines[-1] and "cache hit rate 100.0%" in lines[-1]
    assert "retries" in lines[-1]


def test_no_progress_line_without_an_interval(shards, caplog):
    with caplog.at_level(logging.INFO, logger="fsspec_shards.dataset"):
        list(ShardDataset(shards, log_interval=None))
    assert not [r for r in caplog.records if "samples/s" in r.getMessage()]


class CachingFileSystem(LocalFileSystem):
    """Local files served from whole copies kept in memory, as a caching protocol keeps them;
    ``invalidate_cache(path)`` drops a copy. ``fills`` counts copies made."""

    protocol = "memcached"
    copies: dict = {}
    fills: dict = {}

    def _open(self, path, mode="rb", **kwargs):
        path = self._strip_protocol(path)
        if path not in self.copies:
            self.copies[path] = Path(path).read_bytes()
            self.fills[path] = self.fills.get(path, 0) + 1
        return io.BytesIO(self.copies[path])

    def invalidate_cache(self, path=None):
        if path is not None:
            self.copies.pop(self._strip_protocol(path), None)


@pytest.fixture
def cached_shards(tmp_path):
    fsspec.register_implementation("memcached", CachingFileSystem, clobber=True)
    CachingFileSystem.copies.clear()
    CachingFileSystem.fills.clear()
    return write_shards(tmp_path, 3, 4)


def poison(path: str) -> bytes:
    """Replace a shard by an HTML page of its size; return the shard's bytes."""
    data = Path(path).read_bytes()
    page = b"<html><body>maintenance</body></html>"
    Path(path).write_bytes(page + b" " * (len(data) - len(page)))
    return data


def test_a_cached_copy_found_malformed_is_dropped_and_read_again_from_storage(cached_shards):
    urls = [f"memcached://{path}" for path in cached_shards]
    good = poison(cached_shards[1])
    for path in cached_shards:  # cache every shard, the poisoned page included
        CachingFileSystem().open(path).close()
    Path(cached_shards[1]).write_bytes(good)  # storage recovered; the cache did not notice
    dataset = ShardDataset(urls, shuffle_shards=False)
    assert len(keys(dataset)) == 12
    assert CachingFileSystem.fills[cached_shards[1]] == 2
    assert CachingFileSystem.fills[cached_shards[0]] == 1


def test_a_shard_malformed_twice_in_a_row_goes_to_the_handler(cached_shards, caplog):
    urls = [f"memcached://{path}" for path in cached_shards]
    poison(cached_shards[1])
    with pytest.raises(ShardFormatError, match="shard-0001"):
        list(ShardDataset(urls, shuffle_shards=False))
    assert CachingFileSystem.fills[cached_shards[1]] == 2
    dataset = ShardDataset(urls, shuffle_shards=False, handler="warn")
    with caplog.at_level(logging.INFO, logger="fsspec_shards"):
        assert len(keys(dataset)) == 8
    assert dataset.stats()["shards_failed"] == 1
    assert "reading it once more from storage" in caplog.text


@pytest.mark.parametrize("handler", ["raise", "warn"])
def test_an_empty_shard_goes_through_the_handler(shards, handler):
    Path(shards[2]).write_bytes(b"")
    dataset = ShardDataset(shards, shuffle_shards=False, handler=handler)
    if handler == "raise":
        with pytest.raises(ShardFormatError, match="shard-0002"):
            list(dataset)
    else:
        assert len(keys(dataset)) == 25 and dataset.stats()["shards_failed"] == 1


def test_max_member_size_bounds_every_member(tmp_path):
    urls = write_shards(tmp_path, 2, 3, payload_size=4096)
    with pytest.raises(ShardFormatError, match="exceeds"):
        list(ShardDataset(urls, max_member_size="1KiB"))
    with pytest.raises(ShardFormatError, match="exceeds"):
        ShardDataset(urls, max_member_size=1024, count_samples=True)
    assert len(list(ShardDataset(urls, max_member_size="4KiB"))) == 6
    with pytest.raises(ValueError, match="max_member_size"):
        ShardDataset(urls, max_member_size="lots")


def test_a_poisoned_wds_cache_entry_leaves_at_the_next_read(tmp_path):
    paths = write_shards(tmp_path, 3, 4)
    good = poison(paths[1])
    stamp = os.stat(paths[1])
    options = {"wds": {"cache_dir": str(tmp_path / "cache")}}
    urls = [f"wds::file://{path}" for path in paths]
    skipped = ShardDataset(urls, storage_options=options, shuffle_shards=False, handler="skip")
    assert len(keys(skipped)) == 8  # the page is cached as shard 1, size-correct
    Path(paths[1]).write_bytes(good)  # storage recovered, same size and time
    os.utime(paths[1], ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert len(keys(ShardDataset(urls, storage_options=options, shuffle_shards=False))) == 12
