"""The resumable state: plain JSON, a dozen integers, every field checked, naming what differs."""

from __future__ import annotations

import json

import pytest

from fsspec_shards.iteration.plan import EpochPlan, Segment
from fsspec_shards.iteration.resume.state import (
    SampleRef,
    StreamState,
    check_fingerprint,
    check_position,
    shard_identity,
    urls_digest,
)

PLAN = EpochPlan((Segment(0), Segment(3), Segment(5)), (4, 4, 4))


def position(**fields):
    values = dict(fingerprint={}, shard=1, offset=2048, read=9, delivered=7, rng_counter=5)
    values.update(fields)
    if "window" not in fields:
        values["window"] = SampleRef(0, 1024, 1024, 6)
    return StreamState(**values)


def test_state_round_trips_through_json():
    state = StreamState(
        fingerprint={"seed": 1, "urls": "abc"},
        epoch=3,
        shard=2,
        offset=10240,
        read=50,
        delivered=40,
        rng_counter=17,
        window=SampleRef(1, 512, 512, 31),
        segment_read=4,
        remainder=((Segment(4, 512, 2048), 2), (Segment(1, skip=3, count=5), None)),
    )
    loaded = StreamState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert loaded == state


@pytest.mark.parametrize("bad", [None, {}, {"version": 1}, {"version": 99}])
def test_something_else_than_a_state_is_rejected(bad):
    with pytest.raises(ValueError, match="not a ShardDataset state"):
        StreamState.from_dict(bad)


@pytest.mark.parametrize(
    "field, value",
    [("epoch", "3"), ("shard", 1.5), ("offset", None), ("finished", 1), ("window", [1, 2])],
)
def test_a_malformed_field_is_named(field, value):
    data = position().to_dict()
    data[field] = value
    with pytest.raises(ValueError, match=f"field '{field}'"):
        StreamState.from_dict(data)


def test_a_reachable_position_passes():
    check_position(position(), PLAN, buffer_size=3)
    check_position(StreamState({}), PLAN, buffer_size=0)
    check_position(StreamState({}, shard=3, read=12, delivered=12, finished=True), PLAN, 0)


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"shard": 99}, "shard"),
        ({"shard": -1}, "shard"),
        ({"offset": -512}, "offset"),
        ({"offset": 100}, "offset"),
        ({"shard": 3, "offset": 512}, "offset"),
        ({"delivered": -1, "read": 0}, "delivered"),
        ({"read": 6}, "read"),
        ({"read": 12}, "read"),
        ({"rng_counter": -4}, "rng_counter"),
        ({"segment_read": 10}, "segment_read"),
        ({"epoch": -1}, "epoch"),
        ({"finished": True}, "finished"),
        ({"window": None}, "window"),
        ({"window": SampleRef(2, 0, 0, 6)}, "window"),
        ({"window": SampleRef(1, 2048, 2048, 6)}, "window"),
        ({"window": SampleRef(0, 1000, 1000, 6)}, "window"),
        ({"window": SampleRef(0, 1024, 1024, 8)}, "window"),
        ({"window": SampleRef(0, 1024, 1024, -1)}, "window"),
    ],
)
def test_a_position_no_stream_can_reach_is_refused_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=f"field '{name}'"):
        check_position(position(**fields), PLAN, buffer_size=3)


def test_buffered_samples_need_a_shuffle_buffer_that_holds_them():
    with pytest.raises(ValueError, match="field 'read'"):
        check_position(position(), PLAN, buffer_size=0)
    with pytest.raises(ValueError, match="field 'read'"):
        check_position(position(), PLAN, buffer_size=2)


def test_delivered_past_the_equal_length_is_refused():
    plan = EpochPlan(PLAN.segments, PLAN.samples, length=5)
    with pytest.raises(ValueError, match="field 'delivered'.*exceeds the epoch length 5"):
        check_position(position(), plan, buffer_size=3)


def test_fingerprint_check_names_every_difference():
    with pytest.raises(ValueError) as raised:
        check_fingerprint(
            {"seed": 1, "num_workers": 2, "rank": 0}, {"seed": 2, "num_workers": 4, "rank": 0}
        )
    message = str(raised.value)
    assert "seed (state: 1, dataset: 2)" in message
    assert "num_workers (state: 2, dataset: 4)" in message
    assert "rank" not in message


def test_shard_identity_ignores_signing_but_not_selectors_or_order():
    first = "https://h/a.tar?X-Amz-Signature=1&X-Amz-Date=2&X-Amz-Credential=k"
    again = "https://h/a.tar?X-Amz-Signature=9&X-Amz-Date=8&X-Amz-Credential=k"
    assert shard_identity([first, "https://h/b.tar"]) == shard_identity([again, "https://h/b.tar"])
    assert shard_identity(["https://h/get?key=1"]) != shard_identity(["https://h/get?key=2"])
    assert shard_identity(["a", "b"]) != shard_identity(["b", "a"])


def test_urls_digest_tells_lists_apart():
    assert urls_digest(["a", "b"]) != urls_digest(["b", "a"])
    assert urls_digest(["ab"]) != urls_digest(["a", "b"])
    assert urls_digest(["a", "b"]) == urls_digest(["a", "b"])
