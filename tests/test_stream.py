"""ConsumerStream against sample counts that lie: an absurd count (2**32), a shard that holds fewer
or more samples than its count (an error under handler="raise", equal lengths otherwise)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.lengths import SampleCountError
from tests.shardmaker import keys, write_shards

HELD = [5, 3, 4, 6]


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path, len(HELD), HELD)


def ranks(urls, counts, world_size=2, **args):
    """(len, keys) of every rank's epoch."""
    result = []
    for rank in range(world_size):
        dataset = ShardDataset(
            urls,
            samples_per_shard=dict(zip(urls, counts, strict=True)),
            rank=rank,
            world_size=world_size,
            shuffle_shards=False,
            prefetch=0,
            **args,
        )
        result.append((len(dataset), keys(dataset)))
    return result


def test_an_absurd_count_starts_the_stream_without_planning_it_in_memory(shards):
    counts = dict(zip(shards, [2**32, 3, 4, 6], strict=True))
    # Rank 1 pads its 3 + 6 samples towards 2**32 + 4: its first samples come at once.
    args = dict(samples_per_shard=counts, world_size=2, prefetch=0, shuffle_shards=False)
    dataset = ShardDataset(shards, rank=1, split="shards", **args)
    iterator = iter(dataset)
    assert [next(iterator)["__key__"] for _ in range(10)][:3] == keys(ShardDataset(shards[1:2]))
    # Rank 0 reads the shard whose count lies: a clear error at its end.
    liar = ShardDataset(shards, rank=0, split="shards", **args)
    with pytest.raises(SampleCountError, match=r"shard-0000.tar holds only 5 samples where"):
        keys(liar)
    with pytest.raises(SampleCountError, match="shard-0000.tar holds 5 samples from byte 0"):
        keys(ShardDataset(shards, rank=0, **args))


@pytest.mark.parametrize("split", ["shards", "samples"])
def test_a_shard_holding_more_than_its_count_raises_naming_it(shards, split):
    with pytest.raises(SampleCountError, match=r"shard-0003.tar holds more samples where its"):
        ranks(shards, [5, 3, 4, 4], split=split)


@pytest.mark.parametrize("split", ["shards", "samples"])
def test_a_shard_holding_fewer_than_its_count_raises_naming_it(shards, split):
    with pytest.raises(SampleCountError, match=r"shard-0002.tar holds"):
        ranks(shards, [5, 3, 7, 6], split=split)


@pytest.mark.parametrize("counts", [[5, 3, 7, 6], [5, 3, 4, 4], [9, 3, 4, 1]])
@pytest.mark.parametrize("split", ["shards", "samples"])
def test_other_handlers_keep_every_rank_at_the_equal_length(shards, caplog, counts, split):
    with caplog.at_level(logging.WARNING, logger="fsspec_shards"):
        result = ranks(shards, counts, split=split, handler="warn", shuffle_buffer=2)
    assert "sample count says" in caplog.text
    lengths = {length for length, _ in result}
    assert len(lengths) == 1 and [len(part) for _, part in result] == [lengths.pop()] * 2


def test_a_resume_in_a_pass_past_the_plan_continues_exactly(shards):
    counts = dict(zip(shards, [5, 3, 9, 6], strict=True))  # shard 2 holds 4, not 9
    args = dict(
        samples_per_shard=counts,
        rank=0,
        world_size=2,
        split="shards",
        prefetch=0,
        handler="skip",
        shuffle_shards=False,
    )
    expected = keys(ShardDataset(shards, **args))
    assert len(expected) == 14  # 5 + 4 read, 5 more in a pass past the plan's two
    for cut in (9, 12, 13):
        dataset = ShardDataset(shards, **args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        resumed = ShardDataset(shards, **args)
        resumed.load_state_dict(dataset.state_dict())
        assert head + keys(resumed) == expected, f"cut after {cut}"


def test_an_equal_length_ending_right_at_a_low_count_still_finds_the_shard_longer(tmp_path):
    urls = write_shards(tmp_path, 2, [6, 3])
    # Rank 0 takes shard 0 (count 4, holds 6) and ends at the length 4 right at its count.
    counts = dict(zip(urls, [4, 3], strict=True))
    dataset = ShardDataset(
        urls,
        samples_per_shard=counts,
        rank=0,
        world_size=2,
        split="shards",
        shuffle_shards=False,
        prefetch=0,
    )
    with pytest.raises(SampleCountError, match="shard-0000.tar holds more samples"):
        keys(dataset)


def _resumed_at_every_cut(urls, **args):
    """The cuts after which state_dict() and a fresh dataset do not continue the stream."""
    expected = keys(ShardDataset(urls, **args))
    wrong = []
    for cut in range(len(expected) + 1):
        dataset = ShardDataset(urls, **args)
        iterator = iter(dataset)
        head = [next(iterator)["__key__"] for _ in range(cut)]
        resumed = ShardDataset(urls, **args)
        resumed.load_state_dict(dataset.state_dict())
        if head + keys(resumed) != expected:
            wrong.append(cut)
    return wrong


def test_a_resume_at_the_end_of_a_short_pass_reads_the_next_pass(tmp_path):
    # Rank 2 of 3 reads shard 2 alone (count 6, holds 4) towards rank 0's 17: three planned
    # passes read 12, the passes past the plan 4, then 1; a cut right after sample 16
    # resumes in a pass that reads nothing of the shard's end, and must go on to the next.
    urls = write_shards(tmp_path, 3, [17, 8, 4])
    counts = dict(zip(urls, [17, 8, 6], strict=True))
    args = dict(samples_per_shard=counts, rank=2, world_size=3, split="shards")
    assert _resumed_at_every_cut(urls, handler="skip", shuffle_shards=False, **args) == []


@pytest.mark.parametrize("split", ["shards", "samples"])
def test_a_resume_with_a_buffer_over_a_shard_cut_at_a_low_count_is_exact(shards, split):
    # Shard 0 holds 5 samples, its count says 3: the stream leaves 2 out; the window scan
    # of a resume must leave them out too, not take them for buffered samples.
    counts = dict(zip(shards, [3, 3, 4, 6], strict=True))
    args = dict(samples_per_shard=counts, rank=0, world_size=2, split=split, shuffle_buffer=3)
    assert _resumed_at_every_cut(shards, handler="skip", shuffle_shards=False, **args) == []


def test_a_consumer_left_with_no_sample_warns_naming_itself(tmp_path, caplog):
    urls = write_shards(tmp_path, 2, [3, 3])
    counts = dict(zip(urls, [3, 3], strict=True))
    Path(urls[1]).unlink()  # rank 1's only shard: nothing to read, nothing to pad with
    dataset = ShardDataset(
        urls,
        samples_per_shard=counts,
        rank=1,
        world_size=2,
        split="shards",
        handler="warn",
        shuffle_shards=False,
    )
    with caplog.at_level(logging.WARNING, logger="fsspec_shards"):
        assert keys(dataset) == []
    assert "rank 1 worker 0: epoch 0 ended after 0 samples, short of the equal length 3" in (
        caplog.text
    )
    assert "steps" in caplog.text  # says what it does to a distributed run


EXIT_SCRIPT = """
import sys

import fsspec_shards

urls, cache, mode = sys.argv[1].split(","), *sys.argv[2:]
options = {"wds": {"cache_dir": cache}}
# The main module outlives the first collection at exit (as when anything refers to it):
# its globals, these iterators among them, go after the globals of the modules it imported.
sys.main_module = sys.modules[__name__]
kept = []
for buffer in (0, 8):
    dataset = fsspec_shards.ShardDataset(
        urls, storage_options=options, shuffle_buffer=buffer, prefetch=2
    )
    iterator = iter(dataset)
    next(iterator)
    kept.append(iterator)
if mode == "workers":
    from torch.utils.data import DataLoader

    loader = iter(DataLoader(dataset, batch_size=2, num_workers=2))
    next(loader)
    kept.append(loader)
"""


@pytest.mark.parametrize("mode", ["main", "workers"])
def test_exit_is_silent_with_unfinished_iterators(tmp_path, mode):
    """Iterators alive at interpreter exit (closed once the modules' globals are gone) and
    DataLoader workers mid-epoch: nothing on stderr."""
    import subprocess
    import sys

    if mode == "workers":
        pytest.importorskip("torch")
    shards = write_shards(tmp_path, 3, 12)
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            ",".join(f"wds::file://{path}" for path in shards),
            str(tmp_path / "cache"),
            mode,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
