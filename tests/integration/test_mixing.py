"""MixedDataset with repeat=/choose= over shards on a real S3 (moto): the quotas are taken
through the ``wds`` cache, and a state taken mid-epoch resumes the same stream exactly."""

from __future__ import annotations

import json
from collections import Counter

from fsspec_shards import MixedDataset, ShardDataset
from tests.shardmaker import shard_tar

COUNTS = {"a": [4, 6, 5], "b": [3, 3, 7]}


def _sources(backend, cache_dir) -> list[ShardDataset]:
    options = {"wds": {"cache_dir": str(cache_dir)}, "s3": backend.storage_options}
    datasets = []
    for seed, (name, counts) in enumerate(COUNTS.items()):
        urls = [
            "wds::" + backend.put(f"{name}/train-{i:04d}.tar", shard_tar(i, count))
            for i, count in enumerate(counts)
        ]
        sizes = dict(zip(urls, counts, strict=True))
        datasets.append(
            ShardDataset(
                urls, storage_options=options, samples_per_shard=sizes, seed=seed, shuffle_buffer=4
            )
        )
    return datasets


def _ident(sample: dict) -> tuple[str, str]:
    return sample["__url__"].split("/")[-2], sample["__key__"]


def test_repeat_and_choose_over_s3_resume_exactly(s3_backend, tmp_path):
    for mode in ({"repeat": [0.5, 2]}, {"choose": [11, 4]}):
        mix = MixedDataset(_sources(s3_backend, tmp_path / "cache"), seed=3, **mode)
        whole = [_ident(sample) for sample in mix]
        quota = mix.quotas(0)
        assert Counter(source for source, _ in whole) == dict(zip("ab", quota, strict=True))
        assert quota == ([7, 26] if "repeat" in mode else [11, 4])
        head_mix = MixedDataset(_sources(s3_backend, tmp_path / "cache"), seed=3, **mode)
        iterator = iter(head_mix)
        head = [_ident(next(iterator)) for _ in range(9)]
        state = json.loads(json.dumps(head_mix.state_dict()))
        iterator.close()
        resumed = MixedDataset(_sources(s3_backend, tmp_path / "cold"), seed=3, **mode)
        resumed.load_state_dict(state)
        assert head + [_ident(sample) for sample in resumed] == whole
