"""Exact resumption: samples before state_dict() + samples after load_state_dict() == the
uninterrupted stream, at any point, across epochs, with or without a shuffle buffer; and the
resumed reader seeks instead of re-reading."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from fsspec_shards import ShardDataset
from tests.shardmaker import keys, write_shards

REPO = Path(__file__).resolve().parents[1]


def uninterrupted(args, epochs, first_epoch=0):
    dataset = ShardDataset(**args)
    result = []
    for epoch in range(first_epoch, epochs):
        dataset.set_epoch(epoch)
        result += [(epoch, sample["__key__"], sample["txt"]) for sample in dataset]
    return result


def run_until(dataset, epochs, first_epoch, count, into):
    """Extend ``into`` with samples until it holds ``count``; return the epoch stopped in."""
    for epoch in range(first_epoch, epochs):
        dataset.set_epoch(epoch)
        iterator = iter(dataset)
        while len(into) < count:
            try:
                sample = next(iterator)
            except StopIteration:
                break
            into.append((epoch, sample["__key__"], sample["txt"]))
        else:
            return epoch
    return epochs


def resume(args, state):
    dataset = ShardDataset(**args)
    dataset.load_state_dict(json.loads(json.dumps(state)))
    return dataset


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    counts=st.lists(st.integers(0, 6), min_size=2, max_size=6),
    shuffle_buffer=st.sampled_from([0, 1, 3, 8]),
    shuffle_shards=st.booleans(),
    epochs=st.integers(1, 3),
    cuts=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_two_interruptions_resume_the_stream_exactly(
    counts, shuffle_buffer, shuffle_shards, epochs, cuts
):
    with tempfile.TemporaryDirectory() as directory:
        urls = write_shards(Path(directory), len(counts), counts)
        args = dict(
            urls=urls, shuffle_buffer=shuffle_buffer, shuffle_shards=shuffle_shards, seed=11
        )
        expected = uninterrupted(args, epochs)
        first, second = sorted(int(cut * len(expected)) for cut in cuts)
        seen: list = []
        dataset = ShardDataset(**args)
        epoch = run_until(dataset, epochs, 0, first, seen)
        if epoch < epochs:
            dataset = resume(args, dataset.state_dict())
            epoch = run_until(dataset, epochs, epoch, second, seen)
        if epoch < epochs:
            dataset = resume(args, dataset.state_dict())
            run_until(dataset, epochs, epoch, len(expected) + 1, seen)
        assert seen == expected


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    shuffle_buffer=st.sampled_from([0, 1, 3, 8]),
    consumer=st.tuples(st.integers(1, 9), st.integers(0, 8)),
    split=st.sampled_from(["shards", "samples"]),
    equalize=st.sampled_from(["pad", "truncate", None]),
    cuts=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_equal_length_and_sample_range_epochs_resume_exactly(
    counts, shuffle_buffer, consumer, split, equalize, cuts
):
    world_size, rank = consumer[0], consumer[1] % consumer[0]
    if sum(counts) < world_size:
        counts = counts + [world_size]
    with tempfile.TemporaryDirectory() as directory:
        urls = write_shards(Path(directory), len(counts), counts)
        args = dict(
            urls=urls,
            shuffle_buffer=shuffle_buffer,
            seed=5,
            samples_per_shard={url: n for url, n in zip(urls, counts, strict=True)},
            split=split,
            equalize=equalize,
            rank=rank,
            world_size=world_size,
        )
        try:
            expected = uninterrupted(args, 2)
        except ValueError as exc:  # a consumer without samples cannot be padded
            assert "no samples to pad" in str(exc)
            return
        first, second = sorted(int(cut * len(expected)) for cut in cuts)
        seen: list = []
        dataset = ShardDataset(**args)
        epoch = run_until(dataset, 2, 0, first, seen)
        if epoch < 2:
            dataset = resume(args, dataset.state_dict())
            epoch = run_until(dataset, 2, epoch, second, seen)
        if epoch < 2:
            dataset = resume(args, dataset.state_dict())
            run_until(dataset, 2, epoch, len(expected) + 1, seen)
        assert seen == expected


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path, 5, [3, 4, 2, 5, 3])


@pytest.mark.parametrize("shuffle_buffer", [0, 4])
@pytest.mark.parametrize("resume_loop_at", ["same epoch", "next epoch"])
def test_state_after_a_finished_epoch_resumes_at_the_next_epoch(
    shards, shuffle_buffer, resume_loop_at
):
    args = dict(urls=shards, shuffle_buffer=shuffle_buffer, seed=3)
    expected = uninterrupted(args, 3)
    dataset = ShardDataset(**args)
    dataset.set_epoch(0)
    head = [(0, s["__key__"], s["txt"]) for s in dataset]
    state = dataset.state_dict()
    assert state["finished"] and state["epoch"] == 0
    resumed = resume(args, state)
    tail = []
    for epoch in range(0 if resume_loop_at == "same epoch" else 1, 3):
        resumed.set_epoch(epoch)
        tail += [(epoch, s["__key__"], s["txt"]) for s in resumed]
    assert head + tail == expected


def test_state_after_the_last_sample_leaves_nothing_of_that_epoch(shards):
    dataset = ShardDataset(shards, shuffle_buffer=3)
    total = len(list(ShardDataset(shards, shuffle_buffer=3)))
    iterator = iter(dataset)
    for _ in range(total):
        next(iterator)
    resumed = resume({"urls": shards, "shuffle_buffer": 3}, dataset.state_dict())
    assert list(resumed) == []
    assert len(list(resumed)) == total


def test_set_epoch_to_another_epoch_drops_the_loaded_position(shards):
    dataset = ShardDataset(shards, seed=1)
    iterator = iter(dataset)
    next(iterator)
    resumed = resume({"urls": shards, "seed": 1}, dataset.state_dict())
    resumed.set_epoch(1)
    fresh = ShardDataset(shards, seed=1)
    fresh.set_epoch(1)
    assert keys(resumed) == keys(fresh)


def test_state_dict_before_iterating_is_the_start_of_the_epoch(shards):
    dataset = ShardDataset(shards, seed=1)
    dataset.set_epoch(2)
    resumed = resume({"urls": shards, "seed": 1}, dataset.state_dict())
    assert resumed.epoch == 2
    assert keys(resumed) == keys(dataset)


def test_state_size_does_not_grow_with_the_shuffle_buffer(tmp_path):
    urls = write_shards(tmp_path, 3, 400, payload_size=256)
    sizes = {}
    for shuffle_buffer in (4, 40, 400):
        dataset = ShardDataset(urls, shuffle_buffer=shuffle_buffer)
        iterator = iter(dataset)
        for _ in range(600):
            next(iterator)
        state = dataset.state_dict()
        assert state["read"] - state["delivered"] == shuffle_buffer - 1
        sizes[shuffle_buffer] = len(json.dumps(state))
    assert max(sizes.values()) - min(sizes.values()) < 10
    assert max(sizes.values()) < 600


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seed": 2}, "seed"),
        ({"shuffle_buffer": 5}, "shuffle_buffer"),
        ({"shuffle_shards": False}, "shuffle_shards"),
        ({"urls": "drop-last"}, "urls"),
    ],
)
def test_state_from_other_arguments_is_refused_naming_the_difference(shards, change, message):
    args = dict(urls=shards, seed=1, shuffle_buffer=3)
    dataset = ShardDataset(**args)
    iterator = iter(dataset)
    next(iterator)
    state = dataset.state_dict()
    other = dict(args, **change)
    if other["urls"] == "drop-last":
        other["urls"] = shards[:-1]
    with pytest.raises(ValueError, match=message):
        ShardDataset(**other).load_state_dict(state)


def test_state_from_another_rank_or_world_size_is_refused(shards, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = ShardDataset(shards)
    state = dataset.state_dict()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"rank \(state: 0, dataset: 1\)"):
        ShardDataset(shards).load_state_dict(state)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="world_size"):
        ShardDataset(shards).load_state_dict(state)


@pytest.mark.parametrize("compression", ["gz", "zst"])
@pytest.mark.parametrize("shuffle_buffer", [0, 5])
def test_compressed_shards_resume_exactly(tmp_path, shuffle_buffer, compression):
    urls = write_shards(tmp_path, 4, 6, **{compression: True})
    args = dict(urls=urls, shuffle_buffer=shuffle_buffer, seed=2)
    expected = uninterrupted(args, 1)
    for cut in (1, 7, 13, 23):
        seen: list = []
        dataset = ShardDataset(**args)
        run_until(dataset, 1, 0, cut, seen)
        run_until(resume(args, dataset.state_dict()), 1, 0, len(expected), seen)
        assert seen == expected


def test_torch_save_and_load_of_the_state(shards, tmp_path):
    torch = pytest.importorskip("torch")
    args = dict(urls=shards, shuffle_buffer=4, seed=9)
    expected = uninterrupted(args, 1)
    dataset = ShardDataset(**args)
    seen: list = []
    run_until(dataset, 1, 0, 7, seen)
    torch.save({"dataset_state": dataset.state_dict()}, tmp_path / "checkpoint.pt")
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    resumed = ShardDataset(**args)
    resumed.load_state_dict(checkpoint["dataset_state"])
    run_until(resumed, 1, 0, len(expected), seen)
    assert seen == expected


RESUME_PROGRAM = """
import json, sys
from fsspec_shards import ShardDataset
urls, state_path, mode, count = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
dataset = ShardDataset(urls, shuffle_buffer=6, seed=21)
if mode == "load":
    dataset.load_state_dict(json.load(open(state_path)))
iterator = iter(dataset)
for _ in range(count):
    print(next(iterator)["__key__"])
if mode == "save":
    json.dump(dataset.state_dict(), open(state_path, "w"))
"""


def test_a_new_interpreter_resumes_from_a_state_file(tmp_path):
    urls = write_shards(tmp_path, 4, 8)
    state_path = tmp_path / "state.json"

    def run(mode, count):
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                RESUME_PROGRAM,
                json.dumps(urls),
                str(state_path),
                mode,
                str(count),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            env={"PYTHONHASHSEED": "random", "WDS_SEED": "5", "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    head = run("save", 13)
    tail = run("load", 32 - 13)
    assert head + tail == keys(ShardDataset(urls, shuffle_buffer=6, seed=21))


# --- resuming seeks -----------------------------------------------------------------------


class CountingFile(io.RawIOBase):
    """A local file that adds every byte read to its filesystem's counter."""

    def __init__(self, path, counter):
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._counter = counter

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self._file.seek(offset, whence)

    def tell(self):
        return self._file.tell()

    def readinto(self, buffer):
        count = self._file.readinto(buffer)
        self._counter["bytes"] += count
        return count

    def close(self):
        self._file.close()
        super().close()


class CountingFileSystem(LocalFileSystem):
    """Local files, counting bytes read (cat_ranges reads through open too) and cat_ranges calls."""

    protocol = "countingfile"
    counter = {"bytes": 0, "cat_ranges": 0}

    def _open(self, path, mode="rb", **kwargs):
        return CountingFile(self._strip_protocol(path), self.counter)

    def cat_ranges(self, paths, starts, ends, **kwargs):
        self.counter["cat_ranges"] += 1
        return super().cat_ranges(paths, starts, ends, **kwargs)


@pytest.mark.parametrize("shuffle_buffer", [0, 20])
def test_resume_at_ninety_percent_reads_a_small_part_of_the_data(tmp_path, shuffle_buffer):
    fsspec.register_implementation("countingfile", CountingFileSystem, clobber=True)
    paths = write_shards(tmp_path, 1, 200, payload_size=64 * 1024)
    urls = ["countingfile://" + path for path in paths]
    size = Path(paths[0]).stat().st_size
    args = dict(urls=urls, shuffle_buffer=shuffle_buffer, prefetch=0)
    dataset = ShardDataset(**args)
    iterator = iter(dataset)
    for _ in range(180):
        next(iterator)
    state = dataset.state_dict()
    CountingFileSystem.counter.update(bytes=0, cat_ranges=0)
    resumed = iter(resume(args, state))
    next(resumed)
    # The buffered samples (10% here) by range, then the 1 MiB read-ahead after the offset.
    assert CountingFileSystem.counter["bytes"] < 0.2 * size
    assert CountingFileSystem.counter["cat_ranges"] == (1 if shuffle_buffer else 0)
    assert len(list(resumed)) == 19
    assert CountingFileSystem.counter["bytes"] < 0.25 * size


@pytest.mark.parametrize("how", ["truncated", "corrupt", "missing"])
@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_resume_is_exact_around_a_skipped_broken_shard(tmp_path, how, shuffle_buffer):
    from tests.test_dataset import break_shard

    urls = write_shards(tmp_path, 4, 6)
    break_shard(urls[1], how)
    args = dict(urls=urls, shuffle_buffer=shuffle_buffer, seed=1, handler="skip")
    expected = keys(ShardDataset(**args))
    assert 18 <= len(expected) < 24
    for cut in range(len(expected) + 1):
        dataset = ShardDataset(**args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        assert head + keys(resume(args, dataset.state_dict())) == expected, f"cut after {cut}"


@pytest.mark.parametrize("cache", [True, False])
def test_resume_through_the_wds_filesystem(tmp_path, cache):
    paths = write_shards(tmp_path, 3, 6)
    options = {"wds": {"cache_dir": str(tmp_path / "cache"), "cache": cache}}
    args = dict(
        urls=[f"wds::file://{path}" for path in paths],
        storage_options=options,
        shuffle_buffer=4,
        seed=2,
    )
    expected = keys(ShardDataset(**args))
    for cut in (1, 8, 17):
        dataset = ShardDataset(**args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        assert head + keys(resume(args, dataset.state_dict())) == expected


def test_state_from_another_worker_count_is_refused(shards, monkeypatch):
    from fsspec_shards.iteration import order

    monkeypatch.setattr(order, "worker_split", lambda: (1, 2))
    state = ShardDataset(shards).state_dict()
    monkeypatch.setattr(order, "worker_split", lambda: (0, 1))
    with pytest.raises(ValueError, match=r"num_workers \(state: 2, dataset: 1\)") as raised:
        ShardDataset(shards).load_state_dict(state)
    assert "worker (state: 1, dataset: 0)" in str(raised.value)


# --- a loaded state is validated against the dataset ---------------------------------------


def cut_state(args, cut):
    dataset = ShardDataset(**args)
    iterator = iter(dataset)
    for _ in range(cut):
        next(iterator)
    return dataset.state_dict()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"shard": 99}, "shard"),
        ({"shard": -1}, "shard"),
        ({"offset": -512}, "offset"),
        ({"offset": 1000}, "offset"),
        ({"rng_counter": -1}, "rng_counter"),
        ({"finished": True}, "finished"),
        ({"delivered": -3}, "delivered"),
        ({"read": 3}, "read"),
        ({"window": [99, 0, 0]}, "window"),
        ({"window": None}, "window"),
        ({"remainder": [[99, 0, -1, 0, -1, -1]]}, "remainder"),
        ({"version": 1}, "version"),
    ],
)
def test_a_tampered_state_is_refused_at_load_naming_the_field(shards, change, field):
    args = dict(urls=shards, shuffle_buffer=3, seed=1)
    state = dict(cut_state(args, 7), **change)
    with pytest.raises(ValueError, match=field):
        ShardDataset(**args).load_state_dict(state)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"rng_counter": 1}, "rng_counter"),
        ({"window": "shifted"}, "window"),
        ({"offset": "past the end"}, "offset"),
    ],
)
def test_a_tampered_state_is_refused_before_any_sample_naming_the_field(shards, change, field):
    args = dict(urls=shards, shuffle_buffer=3, seed=1, shuffle_shards=False, handler="skip")
    state = cut_state(args, 6)
    if change.get("window") == "shifted":
        change = {"window": [state["window"][0], state["window"][1] + 512, state["window"][2]]}
    if change.get("offset") == "past the end":
        change = {"offset": Path(shards[state["shard"]]).stat().st_size + 5120}
    if "rng_counter" in change:
        change = {"rng_counter": state["rng_counter"] + 1}
    resumed = ShardDataset(**args)
    resumed.load_state_dict(dict(state, **change))
    with pytest.raises(ValueError, match=field):
        next(iter(resumed))


class SignedLocalFileSystem(LocalFileSystem):
    """Local files reached by URLs with a signature in the query, as a presigned store."""

    protocol = "signedfile"

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).split("?", 1)[0].removeprefix("signedfile://"))


def signed(paths, signature):
    query = f"X-Amz-Credential=AKID&X-Amz-Date=2026{signature}&X-Amz-Signature=SIG{signature}"
    return [f"signedfile://{path}?{query}" for path in paths]


@pytest.mark.parametrize("shuffle_buffer", [0, 4])
def test_re_signed_urls_resume_exactly_and_another_shard_list_is_refused(shards, shuffle_buffer):
    fsspec.register_implementation("signedfile", SignedLocalFileSystem, clobber=True)
    args = dict(urls=signed(shards, "0101"), shuffle_buffer=shuffle_buffer, seed=3)
    expected = keys(ShardDataset(**args))
    dataset = ShardDataset(**args)
    iterator = iter(dataset)
    head = [next(iterator)["__key__"] for _ in range(8)]
    state = json.loads(json.dumps(dataset.state_dict()))
    assert "SIG0101" not in json.dumps(state)
    re_signed = dict(args, urls=signed(shards, "0202"))
    assert head + keys(resume(re_signed, state)) == expected
    with pytest.raises(ValueError, match="urls"):
        ShardDataset(**dict(args, urls=signed(shards[::-1], "0202"))).load_state_dict(state)


def test_samples_show_a_redacted_url_unless_raw_urls_are_asked_for(shards):
    fsspec.register_implementation("signedfile", SignedLocalFileSystem, clobber=True)
    urls = signed(shards, "0101")
    shown = next(iter(ShardDataset(urls, shuffle_shards=False)))["__url__"]
    assert "shard-0000.tar?" in shown and "SIG0101" not in shown and "REDACTED" in shown
    raw = next(iter(ShardDataset(urls, shuffle_shards=False, raw_urls=True)))["__url__"]
    assert raw == urls[0]


def test_get_state_and_set_state_are_the_webdataset_names(shards):
    args = dict(urls=shards, shuffle_buffer=3, seed=2)
    expected = keys(ShardDataset(**args))
    dataset = ShardDataset(**args)
    iterator = iter(dataset)
    head = [next(iterator)["__key__"] for _ in range(5)]
    resumed = ShardDataset(**args)
    resumed.set_state(dataset.get_state())
    assert head + keys(resumed) == expected
