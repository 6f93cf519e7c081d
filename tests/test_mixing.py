"""MixedDataset: proportions, determinism, stop modes, exact resume, DataLoader workers, and
the repeat=/choose= quotas."""

from __future__ import annotations

import json
import pickle
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsspec_shards import MixedDataset, ShardDataset
from fsspec_shards.iteration.mixing import ROUND_EPOCH_STRIDE
from tests.shardmaker import write_shards

torch_data = pytest.importorskip("torch.utils.data")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SOURCES = {"a": [5, 7, 3, 6], "b": [4, 4, 4, 4], "c": [9, 2, 5, 3]}
WEIGHTS = [0.5, 0.3, 0.2]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[list[str]]:
    """Three datasets of four shards each; a sample's source is its shard's directory."""
    root = tmp_path_factory.mktemp("sources")
    result = []
    for name, counts in SOURCES.items():
        (root / name).mkdir()
        result.append(write_shards(root / name, len(counts), counts))
    return result


def source_of(sample: dict) -> str:
    return Path(sample["__url__"]).parent.name


def ident(sample: dict) -> tuple[str, str]:
    return source_of(sample), sample["__key__"]


def make_mix(sources, stop="first_exhausted", seed=0, buffers=(0, 3, 5), **source_options):
    datasets = [
        ShardDataset(urls, seed=10 + index, shuffle_buffer=buffer, **source_options)
        for index, (urls, buffer) in enumerate(zip(sources, buffers, strict=True))
    ]
    return MixedDataset(datasets, weights=WEIGHTS, seed=seed, stop=stop)


def take(iterable, count: int | None = None) -> list[tuple[str, str]]:
    result = []
    for sample in iterable:
        result.append(ident(sample))
        if len(result) == count:
            break
    return result


def test_three_sources_are_drawn_in_proportion_to_their_weights(sources):
    drawn = Counter(source for source, _ in take(make_mix(sources, stop="never"), 10_000))
    for name, weight in zip("abc", WEIGHTS, strict=True):
        assert abs(drawn[name] / 10_000 - weight) < 0.02, drawn  # 4 sigma at most


def test_the_mixture_depends_only_on_seed_and_epoch(sources):
    first = take(make_mix(sources, stop="never"), 300)
    assert take(make_mix(sources, stop="never"), 300) == first
    assert take(make_mix(sources, stop="never", seed=1), 300) != first
    later = make_mix(sources, stop="never")
    later.set_epoch(1)
    assert take(later, 300) != first


def test_each_source_keeps_its_own_order_shuffle_and_split(sources, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    mixed = take(make_mix(sources, stop="all_exhausted"))
    for index, name in enumerate("abc"):
        alone = ShardDataset(sources[index], seed=10 + index, shuffle_buffer=(0, 3, 5)[index])
        assert [key for source, key in mixed if source == name] == [
            sample["__key__"] for sample in alone
        ]


def test_the_mixer_splits_like_its_sources_given_an_explicit_rank(sources, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks = [make_mix(sources, rank=rank, world_size=2) for rank in (0, 1)]
    assert [mix.state_dict()["fingerprint"]["rank"] for mix in ranks] == [0, 1]
    first, second = (take(mix, 20) for mix in ranks)
    assert not set(first) & set(second)  # each rank mixes its own part of every source


def test_all_exhausted_yields_every_sample_of_every_source_once(sources):
    mixed = take(make_mix(sources, stop="all_exhausted"))
    assert len(mixed) == len(set(mixed)) == sum(sum(counts) for counts in SOURCES.values())


def test_first_exhausted_stops_when_one_source_runs_out(sources):
    mixed = take(make_mix(sources, stop="first_exhausted"))
    per_source = Counter(source for source, _ in mixed)
    sizes = {name: sum(counts) for name, counts in SOURCES.items()}
    assert [name for name in "abc" if per_source[name] == sizes[name]] != []
    assert len(mixed) < sum(sizes.values())


def test_never_restarts_an_exhausted_source_on_an_epoch_of_its_own(sources):
    mix = make_mix(sources, stop="never")
    mixed = take(mix, 400)
    from_b = [key for source, key in mixed if source == "b"]
    size = sum(SOURCES["b"])
    first_round, second_round = from_b[:size], from_b[size : 2 * size]
    assert sorted(first_round) == sorted(second_round) and first_round != second_round
    state = mix.state_dict()
    assert state["rounds"][1] >= 2
    assert state["sources"][1]["epoch"] == state["rounds"][1] * ROUND_EPOCH_STRIDE


def test_a_source_without_samples_is_left_out_of_an_endless_mixture(sources, tmp_path, caplog):
    (tmp_path / "e").mkdir()
    empty = ShardDataset(write_shards(tmp_path / "e", 1, 0))
    mix = MixedDataset([ShardDataset(sources[0]), empty], weights=[1, 9], stop="never")
    assert len(take(mix, 200)) == 200
    assert "yields no samples" in caplog.text


def resume_at(make, cut: int, total: int | None) -> list[tuple[str, str]]:
    """The first ``cut`` samples, then those of a fresh mixture from the JSON state."""
    mix = make()
    iterator = iter(mix)
    head = [ident(next(iterator)) for _ in range(cut)]
    state = json.loads(json.dumps(mix.state_dict()))
    iterator.close()
    resumed = make()
    resumed.load_state_dict(state)
    rest = None if total is None else total - cut
    return head + take(resumed, rest)


RESUME_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@RESUME_SETTINGS
@given(
    stop=st.sampled_from(["first_exhausted", "all_exhausted", "never"]),
    cut_fraction=st.floats(0, 1),
    seed=st.integers(0, 3),
    buffers=st.tuples(*[st.sampled_from([0, 2, 6])] * 3),
)
def test_state_dict_resumes_the_mixture_exactly_at_any_point(
    sources, stop, cut_fraction, seed, buffers
):
    def make():
        return make_mix(sources, stop=stop, seed=seed, buffers=buffers)

    total = 150 if stop == "never" else None
    expected = take(make(), total)
    cut = int(cut_fraction * len(expected))
    assert resume_at(make, cut, total) == expected


def test_a_state_from_the_end_of_an_epoch_leads_into_the_next(sources):
    mix = make_mix(sources, stop="all_exhausted")
    epoch_zero = take(mix)
    state = json.loads(json.dumps(mix.state_dict()))
    assert state["finished"]
    resumed = make_mix(sources, stop="all_exhausted")
    resumed.load_state_dict(state)
    assert take(resumed) == []
    resumed.set_epoch(1)
    following = make_mix(sources, stop="all_exhausted")
    following.set_epoch(1)
    assert take(resumed) == take(following) != epoch_zero


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(kind="other"), "not a MixedDataset state"),
        (lambda s: s["fingerprint"].update(weights=[1, 1, 1]), "made with weights="),
        (lambda s: s["fingerprint"].update(seed=5), "made with seed=5"),
        (lambda s: s["fingerprint"].update(num_workers=2), "made with num_workers=2"),
        (lambda s: s.update(rng_counter=-1), "'rng_counter': -1 is below 0"),
        (lambda s: s.update(epoch=-3), "'epoch': -3 is below 0"),
        (lambda s: s.update(exhausted=[0, 0, 0]), "'exhausted': expected bool"),
        (lambda s: s.update(delivered=[1, 2]), "'delivered': expected a list of 3"),
        (lambda s: s.update(rounds=[1, 0, 0]), "'rounds': restarts happen only"),
        (lambda s: s.update(round_delivered=[5, 0, 0]), "'round_delivered': above"),
        (lambda s: s.update(sources=[]), "'sources': expected a list of 3"),
    ],
)
def test_a_state_that_does_not_fit_the_mixture_is_refused_naming_the_field(
    sources, change, message
):
    mix = make_mix(sources)
    take(mix, 5)
    state = json.loads(json.dumps(mix.state_dict()))
    change(state)
    with pytest.raises(ValueError, match=message):
        make_mix(sources).load_state_dict(state)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"sources": []}, "at least one source"),
        ({"weights": [1, 2]}, "2 values for 3 datasets"),
        ({"weights": [1, 0, 1]}, "positive and finite"),
        ({"weights": [1, float("nan"), 1]}, "positive and finite"),
        ({"stop": "longest"}, "stop must be one of"),
        ({"seed": "0"}, "seed must be an int"),
    ],
)
def test_invalid_arguments_are_refused(sources, arguments, message):
    options = {"sources": [ShardDataset(urls) for urls in sources], **arguments}
    with pytest.raises(ValueError, match=message):
        MixedDataset(**options)


def test_the_mixture_pickles_and_iterates_the_same(sources):
    mix = make_mix(sources, stop="never")
    iterator = iter(mix)
    next(iterator)
    assert take(pickle.loads(pickle.dumps(mix)), 100) == take(make_mix(sources, stop="never"), 100)


def collate_idents(batch):
    return [ident(sample) for sample in batch]


def test_dataloader_workers_together_yield_every_sample_once(sources):
    mix = make_mix(sources, stop="all_exhausted")
    loader = torch_data.DataLoader(mix, batch_size=3, num_workers=2, collate_fn=collate_idents)
    seen = [item for batch in loader for item in batch]
    assert len(seen) == len(set(seen)) == sum(sum(counts) for counts in SOURCES.values())


def stateful_loader(dataset, num_workers):
    """A worker that stops answering fails the test in two minutes, not at the suite's
    time-out (``timeout`` only applies with workers)."""
    return stateful.StatefulDataLoader(
        dataset,
        batch_size=2,
        num_workers=num_workers,
        collate_fn=collate_idents,
        timeout=120 if num_workers else 0,
    )


def run_loader(dataset, loader, first_epoch, seen, stop_after=None):
    """Append (epoch, batch) over epochs 0 and 1; stop at ``stop_after``; return the epoch."""
    for epoch in range(first_epoch, 2):
        dataset.set_epoch(epoch)
        for batch in loader:
            seen.append((epoch, batch))
            if len(seen) == stop_after:
                return epoch
    return 2


LOADER_SETTINGS = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("num_workers", [0, 2])
@LOADER_SETTINGS
@given(cut_fraction=st.floats(0, 1), stop=st.sampled_from(["first_exhausted", "all_exhausted"]))
def test_stateful_dataloader_resumes_the_mixture_exactly(sources, num_workers, cut_fraction, stop):
    expected: list = []
    mix = make_mix(sources, stop=stop)
    run_loader(mix, stateful_loader(mix, num_workers), 0, expected)
    cut = max(1, int(cut_fraction * len(expected)))
    mix = make_mix(sources, stop=stop)
    loader = stateful_loader(mix, num_workers)
    seen: list = []
    epoch = run_loader(mix, loader, 0, seen, stop_after=cut)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed_mix = make_mix(sources, stop=stop)
    resumed_mix.set_epoch(epoch)
    resumed = stateful_loader(resumed_mix, num_workers)
    resumed.load_state_dict(state)
    run_loader(resumed_mix, resumed, epoch, seen)
    assert seen == expected, f"cut after {cut} batches"


@pytest.mark.parametrize("weight", [1.7e308, 5e-324, 1e-310, 3.0])
def test_equal_weights_draw_evenly_even_when_their_sum_overflows_or_they_are_subnormal(
    sources, weight
):
    datasets = [ShardDataset(urls, seed=10 + index) for index, urls in enumerate(sources[:2])]
    mix = MixedDataset(datasets, weights=[weight, weight], stop="never")
    drawn = Counter(source for source, _ in take(mix, 2_000))
    assert abs(drawn["a"] / 2_000 - 0.5) < 0.05, drawn  # 4.5 sigma


@pytest.mark.parametrize(
    ("stop", "exhausted"),
    [("all_exhausted", [True] * 3), ("first_exhausted", [True, False, False])],
)
def test_a_state_with_exhausted_sources_but_not_finished_is_refused(sources, stop, exhausted):
    mix = make_mix(sources, stop=stop)
    take(mix, 5)
    state = json.loads(json.dumps(mix.state_dict()))
    state.update(exhausted=exhausted, finished=False)
    with pytest.raises(ValueError, match="'finished'"):
        make_mix(sources, stop=stop).load_state_dict(state)


# --- repeat= and choose= ---------------------------------------------------------------------

SIZES = {name: sum(counts) for name, counts in SOURCES.items()}


def make_counted(sources, seed=0, buffers=(0, 3, 5), batch_size=None, **mode):
    """A repeat=/choose= mixture of the three sources, their lengths known."""
    options = mode.pop("source_options", {})
    datasets = [
        ShardDataset(
            urls,
            seed=10 + index,
            shuffle_buffer=buffer,
            count_samples=True,
            batch_size=batch_size,
            **options,
        )
        for index, (urls, buffer) in enumerate(zip(sources, buffers, strict=True))
    ]
    return MixedDataset(datasets, seed=seed, batch_size=batch_size, **mode)


def per_source(mixed) -> Counter:
    return Counter(source for source, _ in mixed)


def test_repeat_one_takes_every_sample_of_every_source_once(sources):
    mix = make_counted(sources, repeat=[1, 1, 1])
    mixed = take(mix)
    assert len(mixed) == len(set(mixed)) == len(mix) == sum(SIZES.values())


def test_repeat_takes_each_source_r_times_fractions_included(sources):
    mix = make_counted(sources, repeat=[0.5, 2, 1.5])
    mixed = take(mix)
    expected = {"a": SIZES["a"] // 2, "b": 2 * SIZES["b"], "c": int(1.5 * SIZES["c"])}
    assert per_source(mixed) == expected and len(mix) == len(mixed)
    from_b = [key for source, key in mixed if source == "b"]
    first, second = from_b[: SIZES["b"]], from_b[SIZES["b"] :]
    assert sorted(first) == sorted(second) and first != second  # a second pass, a new order
    assert len(set(key for source, key in mixed if source == "a")) == SIZES["a"] // 2


def test_choose_takes_exactly_n_samples_of_each_source(sources):
    mix = make_counted(sources, choose=[3, 40, 0])
    assert per_source(take(mix)) == {"a": 3, "b": 40}


def test_choose_is_exact_over_ranks_and_dataloader_workers(sources):
    choose = [7, 25, 13]
    seen: list = []
    for rank in (0, 1):
        mix = make_counted(sources, choose=choose, source_options={"rank": rank, "world_size": 2})
        loader = torch_data.DataLoader(mix, batch_size=4, num_workers=2, collate_fn=collate_idents)
        seen += [item for batch in loader for item in batch]
    assert per_source(seen) == dict(zip("abc", choose, strict=True))
    assert len(set(item for item in seen if item[0] == "a")) == 7  # under one pass: no repeats


def test_repeat_one_over_workers_takes_each_source_epoch_as_it_is(sources):
    mix = make_counted(sources, repeat=[1, 1, 1], source_options={"equalize": None})
    loader = torch_data.DataLoader(mix, batch_size=3, num_workers=2, collate_fn=collate_idents)
    seen = [item for batch in loader for item in batch]
    assert len(seen) == len(set(seen)) == sum(SIZES.values())
    padded = make_counted(sources, repeat=[1, 1, 1])  # equalize="pad": the epochs as padded
    loader = torch_data.DataLoader(padded, batch_size=3, num_workers=2, collate_fn=collate_idents)
    alone = [ShardDataset(urls, count_samples=True) for urls in sources]
    loaders = [torch_data.DataLoader(dataset, num_workers=2, collate_fn=len) for dataset in alone]
    assert sum(len(batch) for batch in loader) == sum(sum(loader) for loader in loaders) > 56


def test_a_counted_mixture_depends_only_on_seed_and_epoch(sources):
    first = take(make_counted(sources, repeat=[1, 0.5, 2]))
    assert take(make_counted(sources, repeat=[1, 0.5, 2])) == first
    assert take(make_counted(sources, repeat=[1, 0.5, 2], seed=1)) != first
    later = make_counted(sources, repeat=[1, 0.5, 2])
    later.set_epoch(1)
    following = take(later)
    assert following != first and per_source(following) == per_source(first)


@RESUME_SETTINGS
@given(
    mode=st.sampled_from(
        [{"repeat": [1, 1, 1]}, {"repeat": [0.5, 2.5, 1]}, {"choose": [20, 3, 31]}]
    ),
    cut_fraction=st.floats(0, 1),
    seed=st.integers(0, 3),
    buffers=st.tuples(*[st.sampled_from([0, 2, 6])] * 3),
)
def test_a_counted_mixture_resumes_exactly_at_any_point(sources, mode, cut_fraction, seed, buffers):
    def make():
        return make_counted(sources, seed=seed, buffers=buffers, **mode)

    expected = take(make())
    cut = int(cut_fraction * len(expected))
    assert resume_at(make, cut, None) == expected


@pytest.mark.parametrize("num_workers", [0, 3])
@pytest.mark.parametrize("mode", [{"repeat": [0.5, 1.5, 1]}, {"choose": [40, 17, 9]}])
def test_a_counted_mixture_with_batch_size_has_an_exact_loader_length(sources, num_workers, mode):
    options = {"rank": 1, "world_size": 2}
    mix = make_counted(sources, batch_size=2, source_options=options, **mode)
    loader = torch_data.DataLoader(
        mix, batch_size=2, num_workers=num_workers, collate_fn=collate_idents
    )
    batches = list(loader)
    assert len(loader) == len(batches) == len(mix) // 2 > 0
    assert {len(batch) for batch in batches} == {2}
    alone = make_counted(sources, batch_size=2, source_options=options, **mode)
    assert len(alone) == len(mix)  # the same for any number of workers


@pytest.mark.parametrize("num_workers", [0, 2])
@LOADER_SETTINGS
@given(
    cut_fraction=st.floats(0, 1),
    mode=st.sampled_from([{"repeat": [0.5, 2, 1]}, {"choose": [9, 30, 4]}]),
)
def test_stateful_dataloader_resumes_a_counted_mixture_exactly(
    sources, num_workers, cut_fraction, mode
):
    def make():
        return make_counted(sources, batch_size=2, **mode)

    expected: list = []
    mix = make()
    run_loader(mix, stateful_loader(mix, num_workers), 0, expected)
    cut = max(1, int(cut_fraction * len(expected)))
    mix = make()
    loader = stateful_loader(mix, num_workers)
    seen: list = []
    epoch = run_loader(mix, loader, 0, seen, stop_after=cut)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed_mix = make()
    resumed_mix.set_epoch(epoch)
    resumed = stateful_loader(resumed_mix, num_workers)
    resumed.load_state_dict(state)
    run_loader(resumed_mix, resumed, epoch, seen)
    assert seen == expected, f"cut after {cut} batches"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"weights": [1, 1, 1], "repeat": [1, 1, 1]}, "one of weights=, repeat=, choose="),
        ({"repeat": [1, 1, 1], "choose": [1, 1, 1]}, "got repeat and choose"),
        ({"repeat": [1, 1]}, "repeat has 2 values for 3 sources"),
        ({"repeat": [1, -1, 1]}, "finite and >= 0"),
        ({"repeat": [1, float("inf"), 1]}, "finite and >= 0"),
        ({"repeat": [0, 0, 0]}, "takes no sample of any source"),
        ({"repeat": "111"}, "one value per source"),
        ({"choose": [1, 2.5, 1]}, "ints >= 0"),
        ({"choose": [1, 1, 1], "stop": "never"}, "stop= applies to weights"),
        ({"choose": [1, 1, 1], "batch_size": 2}, "source 0 has batch_size=None"),
    ],
)
def test_invalid_counted_arguments_are_refused(sources, arguments, message):
    datasets = [ShardDataset(urls, count_samples=True) for urls in sources]
    with pytest.raises(ValueError, match=message):
        MixedDataset(datasets, **arguments)


def test_counts_need_the_lengths_of_the_sources(sources):
    with pytest.raises(ValueError, match="repeat= needs the length of source 1"):
        MixedDataset(
            [ShardDataset(sources[0], count_samples=True), ShardDataset(sources[1])], repeat=[1, 1]
        )


def test_a_counted_state_does_not_resume_another_quota(sources):
    mix = make_counted(sources, choose=[5, 5, 5])
    take(mix, 4)
    state = json.loads(json.dumps(mix.state_dict()))
    with pytest.raises(ValueError, match="made with choose="):
        make_counted(sources, choose=[5, 6, 5]).load_state_dict(state)
    with pytest.raises(ValueError, match=r"made with choose=\[5, 5, 5\], this mixture has None"):
        make_counted(sources, repeat=[1, 1, 1]).load_state_dict(state)


PAGE = Path(__file__).resolve().parent.parent / "docs" / "mixing.md"


def test_the_code_blocks_of_the_mixing_page_run_in_order():
    namespace: dict = {"__name__": "mixing_page"}
    for index, block in enumerate(re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)):
        exec(compile(block, f"{PAGE}:block{index}", "exec"), namespace)
    assert {"upsampled", "fixed", "batched", "checkpoint"} <= set(namespace)


def test_a_fractional_repeat_takes_the_decimal_share_not_the_float_products(tmp_path):
    source = ShardDataset(write_shards(tmp_path, 1, 100), count_samples=True)
    assert 0.29 * 100 < 29  # the float product would floor to 28
    assert MixedDataset([source], repeat=[0.29]).quotas(0) == [29]
