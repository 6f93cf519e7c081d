"""A plain DataLoader's delivered counts resume exactly: the tracker's state fast-forwards
every worker to the sample after the last one the training loop consumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsspec_shards import ShardDataset
from fsspec_shards.iteration.resume.delivery import DeliveryTracker
from tests.shardmaker import keys, write_shards
from tests.test_resume import resume


def assert_tracker_resumes_exactly_at_every_cut(args: dict) -> None:
    """Cut after every sample count: delivered keys + the resumed stream == the whole stream."""
    expected = keys(ShardDataset(**args))
    for cut in range(len(expected) + 1):
        dataset = ShardDataset(**args)
        tracker = DeliveryTracker(dataset, num_workers=0)
        iterator = iter(dataset)
        head = [tracker.update([next(iterator)])[0]["__key__"] for _ in range(cut)]
        resumed = resume(args, tracker.state_dict())
        assert head + keys(resumed) == expected, f"cut after {cut}"


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_delivered_counts_fast_forward_from_headers_to_the_exact_position(
    tmp_path, gz, shuffle_buffer
):
    urls = write_shards(tmp_path, 4, [5, 0, 7, 4], gz=gz)
    args = dict(urls=urls, shuffle_buffer=shuffle_buffer, seed=8, annotate=True)
    assert_tracker_resumes_exactly_at_every_cut(args)


@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_delivered_counts_resume_exactly_past_a_shard_cut_inside_a_samples_first_member(
    tmp_path, shuffle_buffer
):
    urls = write_shards(tmp_path, 3, 6, payload_size=2000)
    sample_size = 512 + 2048 + 512 + 512  # a .txt member of 2000 bytes, then a .cls member
    shard = Path(urls[1])
    shard.write_bytes(shard.read_bytes()[: 3 * sample_size + 700])
    args = dict(
        urls=urls,
        shuffle_shards=False,
        shuffle_buffer=shuffle_buffer,
        annotate=True,
        handler="skip",
    )
    assert_tracker_resumes_exactly_at_every_cut(args)


def test_state_dict_right_after_loading_delivered_counts_resumes_from_those_counts(tmp_path):
    shards = write_shards(tmp_path, 5, [3, 4, 2, 5, 3])
    args = dict(urls=shards, shuffle_buffer=3, seed=2, annotate=True)
    expected = keys(ShardDataset(**args))
    dataset = ShardDataset(**args)
    tracker = DeliveryTracker(dataset, num_workers=0)
    iterator = iter(dataset)
    head = [tracker.update([next(iterator)])[0]["__key__"] for _ in range(7)]
    loaded = resume(args, tracker.state_dict())
    assert head + keys(resume(args, loaded.state_dict())) == expected
