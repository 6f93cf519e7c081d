"""The resumable state: plain JSON, validated, naming what differs."""

from __future__ import annotations

import json

import pytest

from fsspec_shards.iteration.state import (
    SampleRef,
    StreamState,
    check_fingerprint,
    urls_digest,
)


def test_state_round_trips_through_json():
    state = StreamState(
        fingerprint={"seed": 1, "urls": "abc"},
        epoch=3,
        shard=2,
        offset=10240,
        rng_counter=17,
        buffer=[SampleRef(1, 0, 1024), SampleRef(2, 512, 2048)],
        delivered=40,
    )
    assert StreamState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


@pytest.mark.parametrize("bad", [None, {}, {"version": 99}, {"version": 1, "epoch": 0}])
def test_something_else_than_a_state_is_rejected(bad):
    with pytest.raises(ValueError, match="state"):
        StreamState.from_dict(bad)


def test_fingerprint_check_names_every_difference():
    with pytest.raises(ValueError) as raised:
        check_fingerprint(
            {"seed": 1, "num_workers": 2, "rank": 0}, {"seed": 2, "num_workers": 4, "rank": 0}
        )
    message = str(raised.value)
    assert "seed (state: 1, dataset: 2)" in message
    assert "num_workers (state: 2, dataset: 4)" in message
    assert "rank" not in message


def test_urls_digest_tells_lists_apart():
    assert urls_digest(["a", "b"]) != urls_digest(["b", "a"])
    assert urls_digest(["ab"]) != urls_digest(["a", "b"])
    assert urls_digest(["a", "b"]) == urls_digest(["a", "b"])
